"""The faults of the order API (role `api`), on its TransactWriteItems: a throttle or a conflict before
the call; a commit, then a sleep past the client's timeout; a cancel decided on a PENDING order held
until the order moved on (a stale write the version condition must refuse)."""

from __future__ import annotations

import json
import time
from typing import Any

from botocore.client import BaseClient

from tools.chaos.injection import ApiCall, InjectorBase, client_error
from tools.chaos.plan import API_CONFLICT, API_KINDS, API_STALE_CANCEL, API_THROTTLE

# An outbox item's sort key prefix and envelope attribute (shop/adapters/dynamodb/keys.py, outbox_items.py).
# Not imported: this module is loaded into the function's process before its import path is narrowed to
# its code and layers (tools/local/runtime/worker.py), where importing shop would pin the repository's
# copy instead of the layer's.
_OUTBOX_SK_PREFIX, _ENVELOPE = "OUTBOX#", "envelope"
# A stale cancel waits at most this long for the order to change under it.
_STALE_HOLD_SECONDS = 4.0
_STALE_POLL_SECONDS = 0.05


def _outbox_events(puts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The CloudEvents a transaction's outbox items carry, read from their envelope (the item holds what
    the event is nowhere else: shop/adapters/dynamodb/outbox_items.py)."""
    events = []
    for item in puts:
        sort_key, text = item.get("SK", {}).get("S"), item.get(_ENVELOPE, {}).get("S")
        if not (
            isinstance(sort_key, str) and sort_key.startswith(_OUTBOX_SK_PREFIX) and isinstance(text, str)
        ):
            continue
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _cancel_from_pending(params: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a cancel decided on a PENDING order (its event is sequence 2): the read of that order."""
    cancels = [e for e in events if e.get("type") == "OrderCancelled"]
    if len(cancels) != 1 or cancels[0].get("sequence") != 2:
        return None
    updates = [action["Update"] for action in params["TransactItems"] if "Update" in action]
    if len(updates) != 1:
        return None
    # The order item: the version the cancel was decided on is the one before its event's sequence.
    return {"TableName": updates[0]["TableName"], "Key": updates[0]["Key"], "version": {"N": "1"}}


class ApiFaults(InjectorBase):
    def _api(self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        puts = [action["Put"]["Item"] for action in params["TransactItems"] if "Put" in action]
        events = _outbox_events(puts)
        event_ids = [str(e.get("id")) for e in events]
        order_ids = sorted({str(e.get("subject")) for e in events})
        request_keys = [
            item["PK"]["S"] for item in puts if item.get("entityType", {}).get("S") == "RequestKey"
        ]
        # A create is retried under its Idempotency-Key (a new order id each time); a cancel under its event.
        identity = request_keys or event_ids
        candidates: tuple[str, ...] = API_KINDS
        cancel_from_pending = _cancel_from_pending(params, events)
        if cancel_from_pending is not None:
            candidates = (API_STALE_CANCEL, *API_KINDS)
        kind = self._pick(candidates)
        if kind == API_STALE_CANCEL:
            identity = [f"stale-cancel:{order_id}" for order_id in order_ids]
        if kind is None or not self._claim(kind, identity):
            return original(client, operation, params)
        details = {"event_ids": event_ids, "order_ids": order_ids}
        if kind == API_THROTTLE:
            self._record(kind, operation, **details)
            raise client_error("ThrottlingException", "rate of requests exceeded", operation)
        if kind == API_CONFLICT:
            self._record(kind, operation, **details)
            reasons = [{"Code": "TransactionConflict", "Message": "chaos: transaction is ongoing"}] + [
                {"Code": "None"} for _ in params["TransactItems"][1:]
            ]
            raise client_error(
                "TransactionCanceledException",
                "Transaction cancelled [TransactionConflict]",
                operation,
                CancellationReasons=reasons,
            )
        if kind == API_STALE_CANCEL:
            assert cancel_from_pending is not None
            began = time.monotonic()
            raced = self._hold_until_changed(original, client, cancel_from_pending)
            held = round(time.monotonic() - began, 2)
            self._record(kind, operation, raced=raced, held_seconds=held, **details)
            return original(client, operation, params)
        try:
            result = original(client, operation, params)
        except BaseException:
            # Not committed (a conflict, a condition): no timeout after a commit happened. Give the claim
            # back, or a kind with one slot in a small run would be counted as injected and never logged.
            self.state.release(kind, identity)
            self._satisfied.discard(kind)
            raise
        pause = self.plan.client_timeout_seconds + 1.0
        self._record(kind, operation, sleep_seconds=pause, **details)
        time.sleep(pause)  # committed; the client gives up first and retries with the same key
        return result

    @staticmethod
    def _hold_until_changed(original: ApiCall, client: BaseClient, order: dict[str, Any]) -> bool:
        """Wait until the order's version is no longer the one the cancel was decided on (bounded)."""
        expected = order["version"]
        read = {"TableName": order["TableName"], "Key": order["Key"], "ConsistentRead": True}
        deadline = time.monotonic() + _STALE_HOLD_SECONDS
        while time.monotonic() < deadline:
            item = original(client, "GetItem", read).get("Item") or {}
            if item.get("version") != expected:
                return True
            time.sleep(_STALE_POLL_SECONDS)
        return False
