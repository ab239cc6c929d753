"""The customer notification channel: an SNS topic (shop.domain.notifications says what is sent)."""

from __future__ import annotations

from shop.adapters import aws


class SnsTopic:
    def __init__(self, topic_arn: str) -> None:
        self._topic_arn = topic_arn

    def send(self, message: str, attributes: dict[str, str]) -> str:
        response = aws.sns().publish(
            TopicArn=self._topic_arn,
            Message=message,
            MessageAttributes={
                name: {"DataType": "String", "StringValue": value} for name, value in attributes.items()
            },
        )
        return response["MessageId"]
