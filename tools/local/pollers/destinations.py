"""Delivery to an event source mapping's OnFailure destination (an SQS queue or an SNS topic, by ARN)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sqs import SQSClient


class UnsupportedDestination(ValueError):
    pass


class FailureDestinations:
    def __init__(self, sqs: SQSClient, sns: SNSClient) -> None:
        self._sqs = sqs
        self._sns = sns
        self._queue_urls: dict[str, str] = {}

    def send(self, arn: str, message: dict[str, Any]) -> None:
        body = json.dumps(message)
        service = arn.split(":")[2] if arn.count(":") >= 5 else ""
        if service == "sqs":
            self._sqs.send_message(QueueUrl=self._queue_url(arn), MessageBody=body)
        elif service == "sns":
            self._sns.publish(TopicArn=arn, Message=body)
        else:
            raise UnsupportedDestination(f"OnFailure destination {arn} is not an SQS queue or SNS topic")

    def _queue_url(self, arn: str) -> str:
        if arn not in self._queue_urls:
            *_, account, name = arn.split(":")
            url = self._sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
            self._queue_urls[arn] = url
        return self._queue_urls[arn]
