"""OrderStore=postgres: more publishers at once than the schedule starts, and the database restarted.

PublisherPool keeps about `target` invocations of the outbox publisher running at once, the schedule's
included (EventBridge Scheduler starts one a minute; each polls until the last 5 s of its 70 s): it
invokes the function directly, as `aws lambda invoke` would, `target - 1` times at once, and again as
each invocation ends; when fewer than `target` run (the scheduled one died: a crash between PutEvents
and COMMIT), it adds one rather than wait for the next minute. It samples how many run, four times a
second, for the report (the stack's own count of the function's invocations in progress). With
PostgresRelay=logical only one of them reads the slot at a time (the others' rounds find its advisory
lock taken and pause): given `slot_holders`, it samples too which sessions hold that lock, so the report
says how many invocations ran and how many read the slot at once.

DatabaseRestart stops the order database, keeps it down a few seconds and starts it again on the same
data, in a thread: the drive goes on, and the API answers 503 with Retry-After meanwhile.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tools.chaos.ledger import Ledger
from tools.chaos.plan import DATABASE_RESTART
from tools.local.processes import StartupError
from tools.local.services.order_database import EmbeddedPostgres
from tools.local.stack import LocalStack

PUBLISHER = "OutboxPublisherFunction"
_SAMPLE_SECONDS = 0.25
_TOP_UP_SECONDS = 2.0  # an extra invocation when fewer than the target run, at most this often


@dataclass
class Phase:
    label: str
    target: int
    began: float = field(default_factory=time.monotonic)
    seconds: float = 0.0
    peak: int = 0
    seconds_at_target: float = 0.0  # with at least `target` publishers running
    slot_readers_peak: int | None = None  # PostgresRelay=logical: sessions holding the slot's lock at once

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.label,
            "target": self.target,
            "seconds": round(self.seconds, 1),
            "peak": self.peak,
            "seconds_at_target_or_more": round(self.seconds_at_target, 1),
            **({"slot_readers_peak": self.slot_readers_peak} if self.slot_readers_peak is not None else {}),
        }


class PublisherPool:
    def __init__(
        self,
        stack: LocalStack,
        function: str = PUBLISHER,
        *,
        slot_holders: Callable[[], list[int] | None] | None = None,
    ) -> None:
        self._stack = stack
        self._function = function
        self._slot_holders = slot_holders  # PostgresRelay=logical: the sessions holding the slot's lock
        self.slot_samples = 0  # answered samples
        self.slot_samples_held = 0  # of them, with the lock held
        self.slot_sessions: set[int] = set()  # every session seen holding it
        self._runtime = stack.functions[function]
        self._lock = threading.Lock()
        self._phase: Phase | None = None
        self.phases: list[Phase] = []
        self._direct = 0  # direct invocations under way
        self._last_top_up = 0.0
        self.direct_started = 0
        self.direct_ended = 0
        self.direct_errors: Counter[str] = Counter()
        self.seconds_at: defaultdict[int, float] = defaultdict(float)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._run, name="chaos-publishers", daemon=True)

    def running(self) -> int:
        """Invocations of the publisher in progress (the local runtime's count: scheduled and direct)."""
        return int(getattr(self._runtime, "_busy", 0))

    def start(self, label: str, target: int) -> None:
        self.set_target(label, target)
        self._sampler.start()

    def set_target(self, label: str, target: int) -> None:
        with self._lock:
            if self._phase is not None:
                self.phases.append(self._phase)
            self._phase = Phase(label, target)

    def stop(self) -> None:
        """No more direct invocations (those under way poll on until their end, or the stack's)."""
        with self._lock:
            if self._phase is not None:
                self.phases.append(self._phase)
                self._phase = None
        self._stop.set()
        self._sampler.join(timeout=5)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(_SAMPLE_SECONDS):
            now = time.monotonic()
            elapsed, last = now - last, now
            running = self.running()
            holders = self._slot_holders() if self._slot_holders is not None else None
            with self._lock:
                phase = self._phase
                if phase is None:
                    continue
                if holders is not None:
                    self.slot_samples += 1
                    self.slot_samples_held += 1 if holders else 0
                    self.slot_sessions.update(holders)
                    phase.slot_readers_peak = max(phase.slot_readers_peak or 0, len(holders))
                self.seconds_at[running] += elapsed
                phase.seconds += elapsed
                phase.peak = max(phase.peak, running)
                if running >= phase.target:
                    phase.seconds_at_target += elapsed
                wanted = phase.target - 1 - self._direct  # the schedule runs one
                if wanted <= 0 and running < phase.target and self._direct < phase.target:
                    wanted = 1 if now - self._last_top_up >= _TOP_UP_SECONDS else 0
                    self._last_top_up = now if wanted else self._last_top_up
                self._direct += max(0, wanted)
                self.direct_started += max(0, wanted)
            for _ in range(max(0, wanted)):
                threading.Thread(target=self._invoke, name="chaos-publisher", daemon=True).start()

    def _invoke(self) -> None:
        try:
            result = self._stack.invoke(self._function, {})
        finally:
            with self._lock:
                self._direct -= 1
                self.direct_ended += 1
        if result.error is not None:
            self.direct_errors[result.error.error_type] += 1

    def report(self) -> dict[str, Any]:
        with self._lock:
            phases = [*self.phases, *([self._phase] if self._phase else [])]
            return {
                "phases": [phase.to_dict() for phase in phases],
                "peak": max((phase.peak for phase in phases), default=0),
                "seconds_at": {str(n): round(s, 1) for n, s in sorted(self.seconds_at.items())},
                "direct_invocations_started": self.direct_started,
                "direct_invocations_ended": self.direct_ended,
                "direct_invocation_errors": dict(sorted(self.direct_errors.items())),
                **(
                    {
                        "slot": {
                            "readers_at_once_peak": max(
                                (phase.slot_readers_peak or 0 for phase in phases), default=0
                            ),
                            "samples": self.slot_samples,
                            "samples_with_a_reader": self.slot_samples_held,
                            "sessions_that_read_it": len(self.slot_sessions),
                        }
                    }
                    if self._slot_holders is not None
                    else {}
                ),
            }


class RestartGate:
    """The database's restart, and the relay operations (tools/chaos/relay_operations.py), never at once:
    operations may run together (shared), the restart alone (it waits for those under way, and the
    operations that come meanwhile wait for it)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._operations = 0
        self._restarting = False
        self._restart_due = False  # an operation that comes now waits for the restart (it is not starved)

    @contextmanager
    def operation(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: not self._restarting and not self._restart_due)
            self._operations += 1
        try:
            yield
        finally:
            with self._condition:
                self._operations -= 1
                self._condition.notify_all()

    @contextmanager
    def restart(self) -> Iterator[None]:
        with self._condition:
            self._restart_due = True
            self._condition.wait_for(lambda: not self._restarting and self._operations == 0)
            self._restarting = True
        try:
            yield
        finally:
            with self._condition:
                self._restarting = self._restart_due = False
                self._condition.notify_all()


class DatabaseRestart:
    """The order database stopped and started again on the same data, `down_seconds` later."""

    def __init__(
        self,
        database: EmbeddedPostgres,
        ledger: Ledger,
        down_seconds: float,
        gate: RestartGate | None = None,
    ) -> None:
        self._database = database
        self._ledger = ledger
        self.down_seconds = down_seconds
        self._gate = gate or RestartGate()  # the relay operations under way finish first
        self.window: tuple[float, float] | None = None  # epoch seconds: stop began, start done
        self.at_order: int | None = None
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None

    def start(self, at_order: int) -> None:
        self.at_order = at_order
        self._thread = threading.Thread(target=self._restart, name="chaos-database-restart", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 120.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def _restart(self) -> None:
        with self._gate.restart():
            began = time.time()
            try:
                self._database.restart(self.down_seconds)
            except (
                StartupError,
                OSError,
                subprocess.SubprocessError,
            ) as exc:  # reported with the run (harness errors), not raised here
                self.errors.append(f"the order database did not restart: {exc!r}")
            ended = time.time()
        self.window = (began, ended)
        self._ledger.append(
            DATABASE_RESTART,
            "OrderDatabase",
            "restart",
            at_order=self.at_order,
            down_seconds=self.down_seconds,
            outage_seconds=round(ended - began, 2),
        )

    def report(self) -> dict[str, Any]:
        began, ended = self.window or (0.0, 0.0)
        return {
            "at_order": self.at_order,
            "down_seconds": self.down_seconds,
            "outage_seconds": round(ended - began, 1) if self.window else None,
        }
