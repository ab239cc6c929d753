"""The stack's long-lived threads (pollers, topic watchers, the console's printer): none stops without a word.

Each runs in a SupervisedThread. Whatever escapes its loop is caught at the thread's edge, reported at
once (the stack makes it an error notice: a red console line, and the inspector's health endpoint),
and the loop is started again on the same state after a pause. Restarting, rather than stopping the
stack, keeps a developer's stack relaying while the error is shown, and is what Lambda's event source
mappings do after an internal error: a stream lane resumes from its position with its batches in
flight, a queue's unfinished messages come back after their visibility timeout, so records are
delivered at least once, which the relay and every consumer tolerate. A thread that fails
MAX_RESTARTS times within RESTART_WINDOW_SECONDS is not started again: a crash loop is a bug to see,
not to hide, so the stack counts as failed and `make local` exits with status 1 (tools/local/__main__.py).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_RESTARTS = 5
RESTART_WINDOW_SECONDS = 300.0
_FIRST_PAUSE_SECONDS = 0.5
_MAX_PAUSE_SECONDS = 8.0
_MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class ThreadHealth:
    """One supervised thread, as GET /_local/api/health shows it."""

    name: str
    alive: bool
    restarts: int
    error: str | None  # what stopped it last (None: never failed)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "alive": self.alive, "restarts": self.restarts, "error": self.error}


# (thread name, what happened to it): the stack makes it an error notice, a red line on the console.
FailureReport = Callable[[str, str], None]


def describe_error(exc: BaseException) -> str:
    """`Type: message`, bounded, never raising (a message may be anything: a huge integer, a bad str())."""
    try:
        message = str(exc)
    except Exception as inner:  # noqa: BLE001 - the report must not fail on the error it reports
        message = f"(its message could not be read: {type(inner).__name__})"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


def _stderr_report(name: str, what: str) -> None:
    sys.stderr.write(f"local stack: thread {name}: {what}\n")


class SupervisedThread:
    """A thread running `_run` until `stop()`; a failure is reported and `_run` starts again (see module)."""

    # Class attributes, so a test can make one thread give up sooner.
    max_restarts = MAX_RESTARTS
    first_pause_seconds = _FIRST_PAUSE_SECONDS

    def __init__(self, name: str) -> None:
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervised, name=name, daemon=True)
        self._report: FailureReport = _stderr_report
        self._failures: deque[float] = deque()  # when it failed, within the restart window
        self.restarts = 0
        self.error: str | None = None

    def _run(self) -> None:
        raise NotImplementedError

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def report_failures_to(self, report: FailureReport) -> None:
        self._report = report

    def report(self, what: str) -> None:
        """Report what happened to this thread (or one of its own); a failing report is written to stderr."""
        try:
            self._report(self.name, what)
        except Exception as exc:  # noqa: BLE001 - a failing report must not stop the thread
            _stderr_report(self.name, f"{what} (and its report failed: {describe_error(exc)})")

    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def failed(self) -> bool:
        """Stopped by failures, not by stop(): it will not run again."""
        return self._thread.ident is not None and not self._thread.is_alive() and not self._stop.is_set()

    def health(self) -> ThreadHealth:
        return ThreadHealth(self.name, self.alive(), self.restarts, self.error)

    # --- the thread's edge ------------------------------------------------------------------------
    def _supervised(self) -> None:
        while True:
            try:
                self._run()
            except BaseException as exc:  # noqa: BLE001 - the thread's edge: whatever stops it is reported
                if self._stop.is_set():
                    return  # an error while stopping (a closed client, say) is no failure
                error = describe_error(exc)
            else:
                if self._stop.is_set():
                    return
                error = "its loop ended while the stack runs"
            if not self._failed_again(error):
                return
            self.restarts += 1

    def _failed_again(self, error: str) -> bool:
        """Record and report a failure; True (after a pause) when the loop is to start again."""
        self.error = error
        now = time.monotonic()
        self._failures.append(now)
        while self._failures and now - self._failures[0] > RESTART_WINDOW_SECONDS:
            self._failures.popleft()
        failures = len(self._failures)
        restarting = failures <= self.max_restarts
        within = f"{failures} time(s) within {RESTART_WINDOW_SECONDS:g} s"
        if restarting:
            self.report(f"stopped by {error}; restarting it (failed {within})")
            pause = min(self.first_pause_seconds * 2 ** (failures - 1), _MAX_PAUSE_SECONDS)
            return not self._stop.wait(pause)
        self.report(f"stopped by {error}; failed {within}: not restarted, the stack has failed")
        return False
