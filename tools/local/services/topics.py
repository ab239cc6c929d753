"""Watches what is published to the template's SNS topics, through a queue subscribed to each one."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from tools.local.console.activity import ActivityLog, Publication
from tools.local.supervision import SupervisedThread

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

_WAIT_SECONDS = 1
_ERROR_PAUSE_SECONDS = 1.0
_MAX_RECEIVE = 10
# Publications are shown, not waited on by the saga: after a receive that found some, the next one waits
# this long, so one receive and one delete (moto requests of about 1.5 ms of CPU each) take several
# messages under load instead of one each. Entries keep the time SNS gave the message.
_GATHER_SECONDS = 0.5


def _published_at(envelope: dict[str, Any]) -> float:
    """When SNS published the message (its envelope's Timestamp), else now."""
    try:
        published = datetime.fromisoformat(str(envelope["Timestamp"]))
    except (KeyError, ValueError):
        return time.time()
    return (published if published.tzinfo else published.replace(tzinfo=UTC)).timestamp()


class TopicWatcher(SupervisedThread):
    def __init__(self, topic: str, queue_url: str, sqs: SQSClient, activity: ActivityLog) -> None:
        super().__init__(f"topic-{topic}")
        self.topic = topic
        self._queue_url = queue_url
        self._sqs = sqs
        self._activity = activity

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self._sqs.receive_message(
                    QueueUrl=self._queue_url, MaxNumberOfMessages=_MAX_RECEIVE, WaitTimeSeconds=_WAIT_SECONDS
                ).get("Messages", [])
                for message in messages:
                    envelope = json.loads(message["Body"])
                    self._activity.add(
                        Publication(
                            topic=self.topic,
                            message=str(envelope.get("Message", "")),
                            subject=envelope.get("Subject"),
                            message_id=str(envelope.get("MessageId", "")),
                            attributes=dict(envelope.get("MessageAttributes") or {}),
                            at=_published_at(envelope),
                        )
                    )
                if messages:  # one call for what one receive returned (at most 10, a batch's limit)
                    self._sqs.delete_message_batch(
                        QueueUrl=self._queue_url,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                            for i, m in enumerate(messages)
                        ],
                    )
                if 0 < len(messages) < _MAX_RECEIVE:
                    self._stop.wait(_GATHER_SECONDS)
            except (ClientError, BotoCoreError, json.JSONDecodeError) as exc:
                if self._stop.is_set():
                    return
                self._activity.notice("warning", self.topic, f"reading published messages failed: {exc}")
                self._stop.wait(_ERROR_PAUSE_SECONDS)
