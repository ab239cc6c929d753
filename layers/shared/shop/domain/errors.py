"""Domain errors. Each has a stable machine-readable code; adapters map them to transport statuses."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    code = "DOMAIN_ERROR"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class OrderNotFound(DomainError):
    code = "ORDER_NOT_FOUND"


class IllegalTransition(DomainError):
    code = "ILLEGAL_TRANSITION"


class ConcurrentModification(DomainError):
    """The aggregate changed under us more often than we are willing to retry."""

    code = "CONCURRENT_MODIFICATION"


class IdempotencyKeyReused(DomainError):
    """The same Idempotency-Key was sent with a different request."""

    code = "IDEMPOTENCY_KEY_REUSED"


class RequestInProgress(DomainError):
    """Another request with the same Idempotency-Key is being committed right now."""

    code = "REQUEST_IN_PROGRESS"


class EventTooLarge(DomainError):
    """The event this change would emit cannot be published to EventBridge."""

    code = "EVENT_TOO_LARGE"


class ServiceBusy(DomainError):
    """The data store throttled us; the caller may retry after a short pause."""

    code = "SERVICE_BUSY"


class InvalidEnvelope(DomainError):
    """A message is not a valid CloudEvents 1.0 envelope of this system."""

    code = "INVALID_ENVELOPE"
