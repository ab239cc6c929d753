"""One run of an operator command over an SQS queue (operations/admin.py's redrive commands,
operations/dead_letters.py's move): each message handled at most once, and the messages the run kept
made visible again when it is over."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

_RECEIVE_VISIBILITY_SECONDS = 300  # each message is handled once within a run


class QueueRun:
    """A run's reading of one queue: receive what it has not had yet, keep some, end."""

    def __init__(self, sqs: SQSClient, queue_url: str) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self._seen: set[str] = set()
        self._kept: list[str] = []  # receipt handles

    def receive(self, wanted: int, **options: Any) -> list[MessageTypeDef]:
        """Up to `wanted` messages this run has not had yet: one it has had, received again, is left out
        (none: nothing new). `options`: more ReceiveMessage parameters."""
        received = self._sqs.receive_message(
            QueueUrl=self._queue_url,
            MaxNumberOfMessages=wanted,
            WaitTimeSeconds=1,
            VisibilityTimeout=_RECEIVE_VISIBILITY_SECONDS,
            **options,
        ).get("Messages", [])
        fresh = [m for m in received if m["MessageId"] not in self._seen]
        self._seen.update(m["MessageId"] for m in fresh)
        return fresh

    def keep(self, message: MessageTypeDef) -> None:
        """The message stays in the queue."""
        self._kept.append(message["ReceiptHandle"])

    def end(self) -> None:
        """Kept messages are made visible again once the run is over (not during it: the run would read
        them again), so a run after the cause is fixed finds them at once, not 5 minutes later."""
        for handle in self._kept:
            with contextlib.suppress(ClientError, BotoCoreError):
                self._sqs.change_message_visibility(
                    QueueUrl=self._queue_url, ReceiptHandle=handle, VisibilityTimeout=0
                )
