"""Parked outbox rows as evidence: what an operator does with them, recorded on the row.

A parked row (poison: the publisher or the logical relay parked it whole in the relay poison queue and
marked it `parked_at`) stays in the outbox until an operator either redrives it (`redriven_at`; its
parked mark is cleared so it is published again: by the polling publisher as a pending row, or by the
logical relay through a replay message) or discards it (`discarded_at`, `discarded_by`,
`discard_reason`; it stays parked). Retention (maintenance) deletes neither before that: the row may be
the only copy (a record too large for a poison queue message carries only its key).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg


@dataclass(frozen=True, slots=True)
class ParkedRowState:
    event_id: str
    position: int
    parked_at: datetime | None
    published_at: datetime | None
    redriven_at: datetime | None
    discarded_at: datetime | None
    discarded_by: str | None
    discard_reason: str | None
    last_error: str | None

    @property
    def parked(self) -> bool:
        """Parked and neither redriven since nor discarded: what an operator still has to decide on."""
        return self.parked_at is not None and self.discarded_at is None

    @property
    def parked_again(self) -> bool:
        """Redriven, then parked again (still poison: a new poison message holds it)."""
        return (
            self.parked_at is not None and self.redriven_at is not None and self.parked_at > self.redriven_at
        )


_ROWS = """
SELECT event_id, position, parked_at, published_at, redriven_at, discarded_at, discarded_by,
       discard_reason, last_error
FROM outbox WHERE event_id = ANY(%s) ORDER BY position
"""


def parked_row_states(
    cursor: psycopg.Cursor[Any], event_ids: list[str], *, for_update: bool = False
) -> dict[str, ParkedRowState]:
    """The named rows' publishing and parking state, by event id (ids not in the outbox are absent)."""
    cursor.execute(_ROWS + (" FOR UPDATE" if for_update else ""), (event_ids,))
    return {found[0]: ParkedRowState(*found) for found in cursor.fetchall()}


def unpark(cursor: psycopg.Cursor[Any], positions: list[int]) -> None:
    """Clear the parked mark of rows not discarded, recording the redrive (the last error stays)."""
    if positions:
        cursor.execute(
            "UPDATE outbox SET parked_at = NULL, redriven_at = clock_timestamp(),"
            " pending_since = clock_timestamp()"
            " WHERE position = ANY(%s) AND parked_at IS NOT NULL AND discarded_at IS NULL",
            (positions,),
        )


def mark_redriven(cursor: psycopg.Cursor[Any], positions: list[int]) -> None:
    """Record a redrive of rows that are not parked (the logical relay: replayed again all the same)."""
    if positions:
        cursor.execute(
            "UPDATE outbox SET redriven_at = clock_timestamp() WHERE position = ANY(%s)", (positions,)
        )


def discard(cursor: psycopg.Cursor[Any], positions: list[int], *, by: str, reason: str) -> None:
    """Record an operator's decision that parked rows will never be published (they stay parked)."""
    if positions:
        cursor.execute(
            "UPDATE outbox SET discarded_at = clock_timestamp(), discarded_by = %s, discard_reason = %s"
            " WHERE position = ANY(%s) AND parked_at IS NOT NULL AND discarded_at IS NULL",
            (by, reason, positions),
        )
