"""The faults of the order API (role `api`), on its TransactWriteItems: a throttle or a conflict before
the call; a commit, then a sleep past the client's timeout; a cancel decided on a PENDING order held
until the order moved on (a stale write the version condition must refuse)."""

from __future__ import annotations

import time
from typing import Any

from botocore.client import BaseClient

from tools.chaos.injection import ApiCall, InjectorBase, client_error
from tools.chaos.plan import API_CONFLICT, API_KINDS, API_STALE_CANCEL, API_THROTTLE

# A stale cancel waits at most this long for the order to change under it.
_STALE_HOLD_SECONDS = 4.0
_STALE_POLL_SECONDS = 0.05


def _cancel_from_pending(params: dict[str, Any], puts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a cancel decided on a PENDING order (its event is sequence 2): the read of that order."""
    cancels = [i for i in puts if i.get("eventType", {}).get("S") == "OrderCancelled" and "sequence" in i]
    if len(cancels) != 1 or cancels[0]["sequence"] != {"N": "2"}:
        return None
    updates = [action["Update"] for action in params["TransactItems"] if "Update" in action]
    if len(updates) != 1:
        return None
    # The order item: the version the cancel was decided on is the one before its event's sequence.
    return {"TableName": updates[0]["TableName"], "Key": updates[0]["Key"], "version": {"N": "1"}}


class ApiFaults(InjectorBase):
    def _api(self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        puts = [action["Put"]["Item"] for action in params["TransactItems"] if "Put" in action]
        event_ids = [item["eventId"]["S"] for item in puts if "eventId" in item]
        order_ids = sorted({item["aggregateId"]["S"] for item in puts if "aggregateId" in item})
        request_keys = [
            item["PK"]["S"] for item in puts if item.get("entityType", {}).get("S") == "RequestKey"
        ]
        # A create is retried under its Idempotency-Key (a new order id each time); a cancel under its event.
        identity = request_keys or event_ids
        candidates: tuple[str, ...] = API_KINDS
        cancel_from_pending = _cancel_from_pending(params, puts)
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
