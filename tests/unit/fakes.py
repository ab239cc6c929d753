"""Fault-injecting stand-ins for AWS clients, wrapping the moto-backed real ones."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError


class FaultyEventBridge:
    """Forwards PutEvents to moto, failing chosen entries or whole calls as EventBridge would.

    fail_permanently: event ids answered with a non-retryable per-entry error, every time.
    throttle_entries: event id -> how many times its entry is answered with ThrottlingException.
    throttle_calls:   how many PutEvents calls raise ThrottlingException before calls pass.
    """

    def __init__(
        self,
        real: Any,
        fail_permanently: Iterable[str] = (),
        throttle_entries: dict[str, int] | None = None,
        throttle_calls: int = 0,
    ) -> None:
        self._real = real
        self.fail_permanently = set(fail_permanently)
        self.throttle_entries = dict(throttle_entries or {})
        self.throttle_calls = throttle_calls
        self.calls: list[list[str]] = []  # event ids per PutEvents call, as sent

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [json.loads(entry["Detail"])["id"] for entry in Entries]
        self.calls.append(ids)
        if self.throttle_calls > 0:
            self.throttle_calls -= 1
            raise ClientError(
                {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "PutEvents"
            )
        results: list[dict[str, Any] | None] = [None] * len(Entries)
        forward: list[int] = []
        for position, event_id in enumerate(ids):
            if event_id in self.fail_permanently:
                results[position] = {"ErrorCode": "InvalidArgument", "ErrorMessage": "injected"}
            elif self.throttle_entries.get(event_id, 0) > 0:
                self.throttle_entries[event_id] -= 1
                results[position] = {"ErrorCode": "ThrottlingException", "ErrorMessage": "injected"}
            else:
                forward.append(position)
        if forward:
            sent = self._real.put_events(Entries=[Entries[p] for p in forward])
            for position, outcome in zip(forward, sent["Entries"], strict=True):
                results[position] = outcome
        failed = sum(1 for r in results if r and "ErrorCode" in r)
        return {"FailedEntryCount": failed, "Entries": results}

    def sent_ids(self) -> list[str]:
        return [event_id for call in self.calls for event_id in call]
