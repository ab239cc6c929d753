"""What happened in the local stack: every invocation and notable event, for the console and for tests."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tools.local.runtime.functions import FunctionRuntime, InvocationResult
from tools.local.supervision import describe_error

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


def invoke_directly(
    function: FunctionRuntime, activity: ActivityLog, event: Any, source: str, *, throttle: bool = False
) -> InvocationResult:
    """Invoke a function directly, not from an event source (`make invoke` on a stack, Lambda's Invoke
    API), and record it in the activity log; every request id of it counts as failed on a function error."""
    result = function.invoke(event, throttle=throttle)
    failed = () if result.ok else (result.request_id,)
    activity.add(Invocation(function.logical_id, "direct", source, event, result, failed))
    return result


# The details key of a queue poller's notice of a message its queue's redrive policy moves to the
# dead-letter queue: {"queue", "deadLetterQueue", "receiveCount", "maxReceiveCount", "record"}.
DEAD_LETTERED = "deadLettered"


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
    """A bounded, thread-safe record of invocations and notices, with listeners (the console).

    Entries are added from the pollers' and the API's threads, which call every listener: a listener
    that raises is reported (an error notice) and never reaches the thread that added the entry, so no
    listener can stop a poller or lose an API answer.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._entries: deque[Entry] = deque(maxlen=_KEEP_ENTRIES)
        self._listeners: list[Listener] = []
        self._reporting = threading.local()  # set while a listener's failure is being reported

    def subscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def add(self, entry: Entry) -> None:
        with self._lock:
            self._entries.append(entry)
            listeners = list(self._listeners)
            self._lock.notify_all()
        failures: list[tuple[Listener, Exception]] = []
        for listener in listeners:
            try:
                listener(entry)
            except Exception as exc:  # noqa: BLE001 - a listener's bug is reported, never the caller's
                failures.append((listener, exc))
        for failed, error in failures:  # once every listener has the entry
            self._listener_failed(failed, entry, error)

    def _listener_failed(self, listener: Listener, entry: Entry, exc: Exception) -> None:
        name = getattr(listener, "__qualname__", type(listener).__name__)
        message = f"listener {name} failed on {type(entry).__name__}: {describe_error(exc)}"
        if getattr(self._reporting, "active", False):
            # It failed on the report of a failure too: say it once on stderr, do not loop.
            sys.stderr.write(f"local stack: {message}\n")
            return
        self._reporting.active = True
        try:
            self.notice("error", "activity", message)
        finally:
            self._reporting.active = False

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
