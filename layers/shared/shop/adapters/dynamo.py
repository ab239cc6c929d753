"""Helpers shared by the DynamoDB repositories: error classification for transactions and throttling."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from shop.domain.errors import ServiceBusy

_THROTTLING_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def cancellation_codes(exc: ClientError) -> list[str]:
    """Per-action reason codes of a cancelled transaction, in the order of its TransactItems."""
    reasons: list[dict[str, Any]] = exc.response.get("CancellationReasons", [])  # type: ignore[assignment]
    return [str(reason.get("Code", "None")) for reason in reasons]


def raise_if_throttled(exc: ClientError) -> None:
    """Turn throttling (plain or inside a cancelled transaction) into ServiceBusy."""
    code = error_code(exc)
    if code in _THROTTLING_CODES or (
        code == "TransactionCanceledException"
        and any(reason in {"ThrottlingError", "TransactionConflict"} for reason in cancellation_codes(exc))
    ):
        raise ServiceBusy("the order store is busy; retry shortly") from exc
