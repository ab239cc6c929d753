"""The faults of the consumers (roles `consumer` and `notifier`), on the business write (a
TransactWriteItems on a business table) or the notifier's SNS Publish: a crash or a timeout before it,
a crash after it, a conflict of a hot item, and a crash after Powertools completed the idempotency
record; and the notifier's Publish answers lost on the way (observed, not injected)."""

from __future__ import annotations

import time
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

from tools.chaos.injection import ApiCall, ChaosCrash, InjectorBase, client_error
from tools.chaos.plan import (
    CONSUMER_CONFLICT,
    CONSUMER_TIMEOUT,
    CRASH_AFTER_COMPLETE,
    CRASH_BEFORE_WRITE,
    OBSERVED_PUBLISH_RESPONSE_LOST,
)


class ConsumerFaults(InjectorBase):
    def _watch_lost_responses(self, client: BaseClient) -> None:
        """Record each Publish attempt that ended without a response (the SDK then retries it)."""
        if getattr(client, "_chaos_watched", False):
            return
        setattr(client, "_chaos_watched", True)  # noqa: B010 - a mark on a botocore client

        def on_attempt_end(caught_exception: Exception | None = None, **_: Any) -> None:
            # Sent, maybe received, no answer (a refused connection sent nothing: not counted).
            if isinstance(caught_exception, (ReadTimeoutError, ConnectionClosedError)):
                event_id, message_id = self.batch.current_ids() if self.batch else (None, None)
                self._record(
                    OBSERVED_PUBLISH_RESPONSE_LOST,
                    "Publish",
                    event_ids=[event_id] if event_id else [],
                    message_id=message_id,
                    error=type(caught_exception).__name__,
                )

        client.meta.events.register_first("needs-retry.sns.Publish", on_attempt_end)

    def _may_fail_batch(self) -> tuple[str, str | None] | None:
        """The current message's ids when failing its whole batch keeps every message off the DLQ."""
        assert self.batch is not None
        event_id, message_id = self.batch.current_ids()
        if event_id is None:
            return None
        if any(count > self.plan.max_receive_count - 2 for count in self.batch.receive_counts()):
            return None
        return event_id, message_id

    def _maybe_conflict(self, operation: str, params: dict[str, Any]) -> None:
        """Each attempt of the business transaction may be cancelled by an overlapping one, as on a hot
        item in AWS, whatever happened to the attempts before it (the consumer must ride it out)."""
        fault = self.spec.faults.get(CONSUMER_CONFLICT)
        if fault is None or self.rng.random() >= fault.probability:
            return
        if not self.state.tally(CONSUMER_CONFLICT, fault.cap):
            return
        event_id, message_id = self.batch.current_ids() if self.batch else (None, None)
        self._record(CONSUMER_CONFLICT, operation, event_ids=[event_id], message_id=message_id)
        reasons = [{"Code": "None"} for _ in params["TransactItems"][1:]]
        raise client_error(
            "TransactionCanceledException",
            "Transaction cancelled [TransactionConflict]",
            operation,
            CancellationReasons=[{"Code": "TransactionConflict", "Message": "chaos: hot item"}, *reasons],
        )

    def _effect(
        self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any], after: str
    ) -> Any:
        ids = self._may_fail_batch()
        if ids is None:
            return original(client, operation, params)
        event_id, message_id = ids
        kind = self._pick((CRASH_BEFORE_WRITE, CONSUMER_TIMEOUT, after))
        if kind is None or not self._claim(kind, [event_id]):
            return original(client, operation, params)
        details = {"event_ids": [event_id], "message_id": message_id}
        if kind == CRASH_BEFORE_WRITE:
            self._record(kind, operation, **details)
            raise ChaosCrash(f"chaos: {self.function} dies before {operation}")
        if kind == CONSUMER_TIMEOUT:
            pause = self.spec.timeout_seconds + 5.0
            self._record(kind, operation, sleep_seconds=pause, **details)
            time.sleep(pause)  # the runtime ends the invocation at its deadline; the record stays IN_PROGRESS
            return original(client, operation, params)
        original(client, operation, params)
        self._record(kind, operation, **details)
        raise ChaosCrash(f"chaos: {self.function} dies after {operation}")

    def _completion(
        self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]
    ) -> Any:
        ids = self._may_fail_batch()
        if ids is None:
            return original(client, operation, params)
        event_id, message_id = ids
        kind = self._pick((CRASH_AFTER_COMPLETE,))
        if kind is None or not self._claim(kind, [event_id]):
            return original(client, operation, params)
        original(client, operation, params)
        self._record(kind, operation, event_ids=[event_id], message_id=message_id)
        raise ChaosCrash(f"chaos: {self.function} dies after its idempotency record completed")
