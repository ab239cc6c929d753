"""EventBridge Scheduler for the template's ScheduleV2 (and Schedule) events with rate expressions.

What AWS documents, and this encodes (tests/conformance/test_scheduler.py):
- "EventBridge Scheduler invokes your Lambda function asynchronously" (Lambda developer guide, "Using
  Lambda with Amazon EventBridge Scheduler", with-eventbridge-scheduler.html): the schedule does not wait
  for an invocation to end, so a function that runs longer than the period overlaps the next one.
- A rate expression is `rate(value unit)`, value a positive integer, unit minute(s), hour(s) or day(s);
  targets are invoked with 60-second precision (Scheduler user guide, "Schedule types",
  schedule-types.html). Locally each start is on time (the precision is a window, not a delay).
- A schedule whose State is DISABLED invokes nothing.
Not emulated, listed at start-up: cron and at expressions, flexible time windows (invocations are
exactly periodic), and Lambda's retries of a failed asynchronous invocation (a scheduled function is
started again at the next period anyway). The first invocation is at start-up: on AWS it comes within
one period of the schedule's creation, and a local stack stands for one deployed a while ago.
`time_scale` shortens the period for tests (0.05: a minute lasts 3 s); the function's timeout is not scaled.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from tools.local.console.activity import ActivityLog, Invocation, Notice
from tools.local.pollers.threads import MappingThreads
from tools.local.runtime.functions import FunctionRuntime

_RATE = re.compile(r"^rate\(\s*([1-9][0-9]*)\s+(minute|minutes|hour|hours|day|days)\s*\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


class ScheduleExpressionError(ValueError):
    pass


def rate_seconds(expression: str) -> float:
    """The period of a rate expression; ScheduleExpressionError for anything else."""
    match = _RATE.match(expression.strip())
    if match is None:
        raise ScheduleExpressionError(f"{expression!r} is not a rate expression (rate(value unit))")
    value, unit = int(match.group(1)), match.group(2)
    if (value == 1) != (not unit.endswith("s")):
        # AWS: "rate(1 minute)", "rate(5 minutes)": the singular goes with 1 only.
        raise ScheduleExpressionError(f"{expression!r}: use the singular unit for 1, the plural otherwise")
    return float(value * _UNIT_SECONDS[unit.rstrip("s")])


@dataclass(frozen=True)
class ScheduleSource:
    function: str
    name: str
    period_seconds: float
    payload: Any = None  # the target's Input (JSON); {} when the template gives none
    enabled: bool = True

    @property
    def label(self) -> str:
        return f"{self.function}.{self.name}"


class SchedulePoller(MappingThreads):
    """Starts the function every period without waiting for it (an asynchronous invocation)."""

    def __init__(
        self,
        source: ScheduleSource,
        function: FunctionRuntime,
        activity: ActivityLog,
        time_scale: float = 1.0,
    ) -> None:
        super().__init__(f"schedule-{source.label}")
        self.source = source
        self.function = function
        self.activity = activity
        self.period = source.period_seconds * time_scale
        self.started = 0  # invocations started so far (read by tests)
        self._count_lock = threading.Lock()

    def _run(self) -> None:
        next_start = time.monotonic()
        while not self._stop.is_set():
            with self._count_lock:
                self.started += 1
                number = self.started
            self._start_batch(self._invoke, (), f"schedule-{self.source.label}-{number}")
            next_start += self.period
            self._stop.wait(max(0.0, next_start - time.monotonic()))

    def _invoke(self) -> None:
        event = self.source.payload if self.source.payload is not None else {}
        result = self.function.invoke(event)
        if self._stop.is_set() and not result.ok:
            return  # the stack is stopping: the invocation was ended, not failed
        self.activity.add(
            Invocation(
                self.source.function,
                "schedule",
                self.source.name,
                event,
                result,
                () if result.ok else (result.request_id,),
            )
        )
        if not result.ok:
            self.activity.add(
                Notice(
                    "warning",
                    self.source.label,
                    "scheduled invocation failed; the next period starts the function again",
                    {"error": str(result.error)[:500] if result.error else ""},
                )
            )
