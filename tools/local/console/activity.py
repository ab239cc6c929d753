"""What happened in the local stack: every invocation and notable event, for the console and for tests."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tools.local.runtime.functions import InvocationResult

Trigger = Literal["api", "dynamodb", "sqs", "schedule", "direct"]
Level = Literal["info", "warning", "error"]
_KEEP_ENTRIES = 10_000


@dataclass(frozen=True)
class Invocation:
    function: str
    trigger: Trigger
    source: str  # table, queue or route the event came from
    event: Any
    result: InvocationResult
    # Record ids the function reported as failed (ReportBatchItemFailures), or every id on error.
    failed_ids: tuple[str, ...] = ()
    at: float = field(default_factory=time.time)

    @property
    def records(self) -> list[dict[str, Any]]:
        records = self.event.get("Records", []) if isinstance(self.event, dict) else []
        return [r for r in records if isinstance(r, dict)]


@dataclass(frozen=True)
class Notice:
    level: Level
    component: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Publication:
    """A message published to one of the template's SNS topics (seen through a local subscription)."""

    topic: str
    message: str
    subject: str | None = None
    message_id: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)


Entry = Invocation | Notice | Publication
Listener = Callable[[Entry], None]


class ActivityLog:
    """A bounded, thread-safe record of invocations and notices, with listeners (the console)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._entries: deque[Entry] = deque(maxlen=_KEEP_ENTRIES)
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def add(self, entry: Entry) -> None:
        with self._lock:
            self._entries.append(entry)
            listeners = list(self._listeners)
            self._lock.notify_all()
        for listener in listeners:
            listener(entry)

    def notice(
        self, level: Level, component: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        self.add(Notice(level, component, message, details or {}))

    def entries(self) -> list[Entry]:
        """Everything recorded (the last _KEEP_ENTRIES), oldest first."""
        with self._lock:
            return list(self._entries)

    def invocations(self, function: str | None = None) -> list[Invocation]:
        with self._lock:
            entries = list(self._entries)
        return [e for e in entries if isinstance(e, Invocation) and function in (None, e.function)]

    def notices(self) -> list[Notice]:
        with self._lock:
            return [e for e in self._entries if isinstance(e, Notice)]

    def publications(self, topic: str | None = None) -> list[Publication]:
        with self._lock:
            entries = list(self._entries)
        return [e for e in entries if isinstance(e, Publication) and topic in (None, e.topic)]

    def wait_for_change(self, timeout: float) -> None:
        """Block until a new entry arrives or the timeout passes."""
        with self._lock:
            self._lock.wait(timeout)
