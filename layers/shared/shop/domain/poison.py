"""Poison outbox records: items the relay can never publish (undecodable image, invalid envelope, an
event larger than the bus accepts). They fail the same way on every retry, so the relay parks them
whole in a sink and moves on (adapters.poison_queue says why, and what a parked message holds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class PoisonRecord:
    sequence_number: str
    event_id: str
    reason: str
    image: dict[str, Any]  # the record exactly as the stream delivered it
    details: dict[str, Any] = field(default_factory=dict)
    stream_arn: str | None = None


class PoisonSink(Protocol):
    def park(self, record: PoisonRecord) -> None:
        """Keep the record durably; raise when it could not be kept (the relay then waits)."""
