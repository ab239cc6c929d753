"""What `python -m operations redrive-poison` prints, canned for the inspector's tests: a Powertools log
line (not a report) and one message's report."""

from __future__ import annotations

POISON_REPORT = {
    "messageId": "m-1",
    "source": "poison queue",
    "expected": 1,
    "found": 1,
    "published": 1,
    "missing": [],
    "unpublished": [],
    "complete": True,
}
POWERTOOLS_LINE = {"level": "INFO", "message": "outbox events republished", "complete": True}
