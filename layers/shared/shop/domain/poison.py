"""Poison outbox records: events a relay can never publish (undecodable image, invalid envelope, an
event larger than the bus accepts). They fail the same way on every retry, so the relay parks them
whole in a sink and moves on (adapters.poison_queue says why, and what a parked message holds).

A poison record names its store by its position, whatever the store:
- StreamPosition: a record of a table stream (the DynamoDB order and inventory stores): its sequence
  number in the stream, and the stream;
- RowPosition: a row of the outbox table (the PostgreSQL order store): its position in the outbox.
A parked record comes back from its message as a ParkedPoison, which its position hands to the
redrive for its store (ParkedRedrive): callers never ask which store it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


@dataclass(frozen=True, slots=True)
class StreamPosition:
    """Where a table stream delivered the record: its sequence number (empty when the record was read
    back from the table, not the stream) and the stream's ARN."""

    sequence_number: str
    stream_arn: str | None = None
    store: ClassVar[str] = "dynamodb"

    @property
    def marker(self) -> str:
        """The position as one string (logs, the message's sequenceNumber)."""
        return self.sequence_number

    def redriven_by[R](self, redrive: ParkedRedrive[R], parked: ParkedPoison) -> R:
        return redrive.from_stream(parked, self)


@dataclass(frozen=True, slots=True)
class RowPosition:
    """Where the outbox table holds the row: its position (the outbox's identity column)."""

    position: int
    store: ClassVar[str] = "postgres"

    @property
    def marker(self) -> str:
        """The position as one string (logs, the message's sequenceNumber)."""
        return str(self.position)

    def redriven_by[R](self, redrive: ParkedRedrive[R], parked: ParkedPoison) -> R:
        return redrive.from_outbox_row(parked, self)


type PoisonPosition = StreamPosition | RowPosition


@dataclass(frozen=True, slots=True)
class PoisonRecord:
    position: PoisonPosition
    event_id: str
    reason: str
    image: dict[str, Any]  # the record exactly as its store delivered it
    # What finds the image in its store again when a message cannot hold it (the item's key in its
    # table; the row's store, position and event id).
    key: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def store(self) -> str:
        return self.position.store


@dataclass(frozen=True, slots=True)
class ParkedPoison:
    """A parked record as its message gives it back: the image whole, or (too large for a message) None
    and only its key."""

    event_id: str
    position: PoisonPosition
    image: object  # as the message holds it: None when omitted; anything else is checked by the redrive
    key: dict[str, Any]

    def redrive[R](self, redrive: ParkedRedrive[R]) -> R:
        """Hand the record to the redrive for its store."""
        return self.position.redriven_by(redrive, self)


class ParkedRedrive[R](Protocol):
    """Republishing a parked record, per kind of position."""

    def from_stream(self, parked: ParkedPoison, position: StreamPosition) -> R: ...

    def from_outbox_row(self, parked: ParkedPoison, position: RowPosition) -> R: ...


class PoisonSink(Protocol):
    def park(self, record: PoisonRecord) -> None:
        """Keep the record durably; raise when it could not be kept (the relay then waits)."""
