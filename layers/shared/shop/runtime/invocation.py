"""The current invocation's deadline, for work that must fit in it (the repositories' retries).

Lambda runs one invocation at a time in an execution environment, so the handler records its context
here when an invocation starts; outside Lambda (scripts, tests) there is no deadline.
"""

from __future__ import annotations

from typing import Protocol


class _Context(Protocol):
    def get_remaining_time_in_millis(self) -> int: ...


_current: _Context | None = None


def begin(context: _Context) -> None:
    global _current
    _current = context


def seconds_left() -> float:
    """Seconds until the current invocation times out; infinite when no invocation was begun."""
    return float("inf") if _current is None else _current.get_remaining_time_in_millis() / 1000
