"""Fault-injecting stand-ins for AWS clients, wrapping the moto-backed real ones."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from botocore.exceptions import ClientError

from shop.adapters.dynamodb import keys


class FaultyEventBridge:
    """Forwards PutEvents to moto, failing chosen entries or whole calls as EventBridge would.

    fail_permanently: event ids answered with a non-retryable error of the account's configuration
                      (AccessDeniedException), every time: the relay must wait for an operator.
    reject:           event ids EventBridge refuses for what they are, every time, with `reject_code`
                      (MalformedDetail or InvalidArgument: the two codes AWS lists as such).
    throttle_entries: event id -> how many times its entry is answered with ThrottlingException.
    throttle_calls:   how many PutEvents calls raise ThrottlingException before calls pass.
    raise_on_every_call: an error code (AccessDeniedException, ThrottlingException, ...) that every
                      PutEvents call raises as a ClientError once `calls_before_raising` calls passed:
                      the whole call fails, no entry is answered.
    """

    def __init__(
        self,
        real: Any,
        fail_permanently: Iterable[str] = (),
        reject: Iterable[str] = (),
        throttle_entries: dict[str, int] | None = None,
        throttle_calls: int = 0,
        reject_code: str = "MalformedDetail",
        raise_on_every_call: str | None = None,
        calls_before_raising: int = 0,
    ) -> None:
        self._real = real
        self.fail_permanently = set(fail_permanently)
        self.reject = set(reject)
        self.reject_code = reject_code
        self.throttle_entries = dict(throttle_entries or {})
        self.throttle_calls = throttle_calls
        self.raise_on_every_call = raise_on_every_call
        self.calls_before_raising = calls_before_raising
        self.calls: list[list[str]] = []  # event ids per PutEvents call, as sent
        self.entries: list[dict[str, Any]] = []  # every entry of every call, as sent

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [json.loads(entry["Detail"])["id"] for entry in Entries]
        self.calls.append(ids)
        self.entries.extend(Entries)
        if self.raise_on_every_call is not None and len(self.calls) > self.calls_before_raising:
            raise ClientError(
                {"Error": {"Code": self.raise_on_every_call, "Message": "injected"}}, "PutEvents"
            )
        if self.throttle_calls > 0:
            self.throttle_calls -= 1
            raise ClientError(
                {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "PutEvents"
            )
        results: list[dict[str, Any] | None] = [None] * len(Entries)
        forward: list[int] = []
        for position, event_id in enumerate(ids):
            if event_id in self.fail_permanently:
                results[position] = {"ErrorCode": "AccessDeniedException", "ErrorMessage": "injected"}
            elif event_id in self.reject:
                results[position] = {"ErrorCode": self.reject_code, "ErrorMessage": "injected"}
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


def _touches(request: Any, refuse: Callable[[str], bool]) -> bool:
    """Whether a DynamoDB request (its arguments, at any depth) names an item `refuse` picks by sort key."""
    if isinstance(request, dict):
        sort_key = request.get(keys.SK)
        if isinstance(sort_key, dict) and refuse(str(sort_key.get("S", ""))):
            return True
        return any(_touches(value, refuse) for value in request.values())
    if isinstance(request, list):
        return any(_touches(value, refuse) for value in request)
    return False


class WritesRefused:
    """Forwards to moto, refusing every write of an item whose sort key `refuse` picks, as DynamoDB
    refuses an action it cannot apply (e.g. an item over 400 KB): a transaction is cancelled whole,
    nothing of it written; a single write fails alone. Reads and other writes pass through.
    """

    def __init__(self, real: Any, refuse: Callable[[str], bool]) -> None:
        self._real = real
        self._refuse = refuse
        self.refused: list[str] = []  # the operations refused, in order

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def transact_write_items(self, **kwargs: Any) -> Any:
        actions: list[dict[str, Any]] = kwargs["TransactItems"]
        if not _touches(actions, self._refuse):
            return self._real.transact_write_items(**kwargs)
        self.refused.append("TransactWriteItems")
        reasons: list[Any] = [
            {"Code": "ValidationError", "Message": "injected"}
            if _touches(action, self._refuse)
            else {"Code": "None"}
            for action in actions
        ]
        raise ClientError(
            {
                "Error": {"Code": "TransactionCanceledException", "Message": "injected"},
                "CancellationReasons": reasons,
            },
            "TransactWriteItems",
        )

    def _single(self, operation: str, kwargs: dict[str, Any]) -> Any:
        if not _touches(kwargs, self._refuse):
            return getattr(self._real, operation)(**kwargs)
        self.refused.append(operation)
        raise ClientError({"Error": {"Code": "ValidationException", "Message": "injected"}}, operation)

    def put_item(self, **kwargs: Any) -> Any:
        return self._single("put_item", kwargs)

    def update_item(self, **kwargs: Any) -> Any:
        return self._single("update_item", kwargs)

    def batch_write_item(self, **kwargs: Any) -> Any:
        return self._single("batch_write_item", kwargs)
