"""The console's printer: one thread writes the hop lines, in the order the entries came.

The stack's threads (pollers, the API's) only post an entry and go on: a paused or slow terminal (a
full pipe, Ctrl-S) never holds a poller, and a line that fails to render cannot reach one. The printer
is a supervised thread (tools/local/supervision.py), and what waits for it is bounded: past
_MAX_WAITING entries, new ones are counted and the count printed once it catches up.

A line waits, briefly, for what the function said about its records (console/reports.py): the log pump
reads a function's log lines while its answer travels on another pipe, so the lines may come a moment
after the answer. Only the functions that write such reports are waited for, and at most
_REPORT_WAIT_SECONDS after the invocation ended.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Protocol

from tools.local.console.activity import Entry, Invocation
from tools.local.console.reports import FunctionReports, RecordReport
from tools.local.supervision import SupervisedThread

_MAX_WAITING = 10_000
_POLL_SECONDS = 0.25
_REPORT_WAIT_SECONDS = 0.5
_REPORTED_TRIGGERS = frozenset({"sqs", "dynamodb"})


class PrintedConsole(Protocol):
    """What the printer uses of the console (render.Console, which makes its printer and hands it itself):
    the lines of an entry, the writing of a line, and the functions' reports."""

    @property
    def reports(self) -> FunctionReports: ...
    def lines(self, entry: Entry, reports: list[RecordReport] | None = None) -> list[str]: ...
    def print(self, text: str = "") -> None: ...


def expected_reports(invocation: Invocation) -> int:
    """How many reports the function writes for this invocation: one per record of a batch it answered
    (a scheduled function's reports are printed as they come: Console.use_reports)."""
    if invocation.result.error is not None or invocation.trigger not in _REPORTED_TRIGGERS:
        return 0
    return len(invocation.records)


class ConsolePrinter(SupervisedThread):
    def __init__(self, console: PrintedConsole) -> None:
        super().__init__("console")
        self._console = console
        self._waiting: queue.Queue[Entry | str] = queue.Queue(maxsize=_MAX_WAITING)
        self._lock = threading.Lock()
        self._started = False
        self._dropped = 0

    def ensure_started(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                self.start()

    def post(self, item: Entry | str) -> None:
        """Queue an entry (or a line) for printing; never blocks, never raises."""
        self.ensure_started()
        try:
            self._waiting.put_nowait(item)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def flush(self, timeout: float) -> None:
        """Wait until every posted item is printed, or `timeout` s."""
        done = self._waiting.all_tasks_done
        with done:
            done.wait_for(lambda: self._waiting.unfinished_tasks == 0 or not self.alive(), timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._waiting.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            try:
                self._print(item)
            finally:
                self._waiting.task_done()

    def _print(self, item: Entry | str) -> None:
        lines = [item] if isinstance(item, str) else self._console.lines(item, self._reports(item))
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        if dropped:
            lines.insert(0, f"(… {dropped} console line(s) dropped: the terminal could not keep up)")
        for line in lines:
            self._console.print(line)

    def _reports(self, entry: Entry) -> list[RecordReport]:
        if not isinstance(entry, Invocation):
            return []
        reports = self._console.reports
        request_id = entry.result.request_id
        expected = expected_reports(entry)
        if not expected or not (reports.reports(entry.function) or entry.result.cold_start):
            return reports.of(request_id)
        timeout = max(0.0, entry.at + _REPORT_WAIT_SECONDS - time.time())
        return reports.wait(request_id, expected, timeout)
