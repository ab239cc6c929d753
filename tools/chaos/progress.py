"""The live line of `make chaos`: orders sent and settled, faults injected, rule breaks seen so far.

On a terminal it is one line redrawn in place (`\\r`, cut to the terminal's width so it never wraps),
twice a second; elsewhere (CI logs, `tee`) a plain line every 10 s and at each phase change, so a log
gets a few lines a minute, never a flood. The harness's own messages go through `say`, which clears the
line before printing and redraws it after.

What is counted live is only what the harness has at hand without touching the stack: the orders it has
sent, the orders whose end event (confirmed, rejected or cancelled) its bus capture has seen, the ledger's
injected faults, and the rule breaks it sees as they happen (API answers that break the contract, requests
given up after the retry budget, foreign messages on the bus, unreadable notifications, harness errors).
Deaths of function environments that no fault explains are shown beside them, not counted as breaks (the
notification check explains some of them). The invariants themselves (lost, phantom, duplicate effects,
final states, dead letters) are known only after the drain, when the checks read the stores.

Hand-written, no dependency: tqdm or rich would draw the bar, but the line's content is ours and a
redraw is `\\r` and a pad, so neither would earn a place in requirements-dev.txt.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

REDRAW_SECONDS = 0.5  # a terminal's line
PLAIN_SECONDS = 10.0  # a log's line
BAR_WIDTH = 20  # on a terminal of 100 columns or more (half below)
_CLEAR = "\r\x1b[K"  # back to the line's start, erase to its end


@dataclass(frozen=True)
class Counts:
    """The run as the harness sees it now."""

    phase: str  # drive, drain, check, ...
    orders: int  # ORDERS
    sent: int  # creates the harness has sent
    settled: int  # orders whose end event reached the bus capture
    faults: int  # injected faults in the ledger so far
    rule_breaks: int  # rule breaks seen live (see the module docstring)
    uninjected_deaths: int  # environment deaths no injected fault explains (not counted as breaks)
    elapsed: float  # seconds since the stack was up


def bar(counts: Counts, width: int = BAR_WIDTH) -> str:
    """`[####====....]`: settled (#), sent and not settled yet (=), not sent (.), of the run's orders."""
    total = max(1, counts.orders)  # rounded down: the bar is full only when every order is
    settled = width * min(counts.settled, total) // total
    sent = max(settled, width * min(counts.sent, total) // total)
    return "[" + "#" * settled + "=" * (sent - settled) + "." * (width - sent) + "]"


def _deaths(counts: Counts) -> str:
    return f", deaths not injected {counts.uninjected_deaths}" if counts.uninjected_deaths else ""


def terminal_line(counts: Counts, columns: int = 120) -> str:
    """The redrawn line, at most `columns` - 1 characters (a line that wraps cannot be redrawn): the
    orders and the live rule breaks always, then what fits of the faults, deaths, time and a reminder."""
    room = max(1, columns - 1)
    width = BAR_WIDTH if room >= 100 else BAR_WIDTH // 2
    line = (
        f"{counts.phase:<5} {bar(counts, width)} sent {counts.sent}/{counts.orders}, "
        f"settled {counts.settled}/{counts.orders}, live rule breaks {counts.rule_breaks}"
    )
    extras = [
        *([f"deaths not injected {counts.uninjected_deaths}"] if counts.uninjected_deaths else []),
        f"faults {counts.faults}",
        f"{counts.elapsed:.0f} s",
        "invariants: after the drain",
    ]
    for extra in extras:
        if len(line) + 3 + len(extra) <= room:
            line += " | " + extra
    return line[:room]


def plain_line(counts: Counts, clock: str | None = None) -> str:
    """A log's line, stamped like the harness's other messages."""
    stamp = clock if clock is not None else time.strftime("%H:%M:%S")
    return (
        f"[chaos {stamp}] progress ({counts.phase}, {counts.elapsed:.0f} s): "
        f"{counts.sent}/{counts.orders} orders sent, {counts.settled} settled (end event on the bus); "
        f"{counts.faults} faults injected; rule breaks seen live {counts.rule_breaks}{_deaths(counts)} "
        "(the invariants are checked after the drain)"
    )


def is_terminal(stream: TextIO) -> bool:
    return stream.isatty() and os.environ.get("TERM", "") != "dumb"


class ProgressLine:
    """Draws `sample()` on `stream` from a thread: redrawn on a terminal, plain lines elsewhere."""

    def __init__(
        self,
        sample: Callable[[], Counts],
        stream: TextIO | None = None,
        *,
        terminal: bool | None = None,
        redraw_seconds: float = REDRAW_SECONDS,
        plain_seconds: float = PLAIN_SECONDS,
    ) -> None:
        self._sample = sample
        self._stream = stream if stream is not None else sys.stdout
        self.terminal = is_terminal(self._stream) if terminal is None else terminal
        self._interval = redraw_seconds if self.terminal else plain_seconds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False  # a terminal line is on screen, not ended by a newline

    def start(self) -> None:
        if self.terminal:  # a log's first line is the first phase's (the harness draws at each)
            self.draw()
        self._thread = threading.Thread(target=self._run, name="chaos-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.draw()

    def draw(self) -> None:
        """The line now (a phase change draws at once, between the periodic lines)."""
        try:
            counts = self._sample()
        except Exception as exc:  # noqa: BLE001 - the line must never stop the run
            counts = None
            self.say(f"progress: could not sample the run: {exc!r}")
        if counts is None:
            return
        with self._lock:
            if self.terminal:
                columns = shutil.get_terminal_size((120, 24)).columns
                self._stream.write(_CLEAR + terminal_line(counts, columns))
                self._drawn = True
            else:
                self._stream.write(plain_line(counts) + "\n")
            self._stream.flush()

    def say(self, message: str) -> None:
        """A message on its own line; a terminal's progress line is cleared first and redrawn below."""
        with self._lock:
            if self.terminal and self._drawn:
                self._stream.write(_CLEAR)
            self._stream.write(message + "\n")
            self._stream.flush()
            redraw = self.terminal and self._drawn
        if redraw and not self._stop.is_set():
            self.draw()

    def stop(self) -> None:
        """The last line, ended by a newline (what follows starts on a line of its own)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            self.draw()
            with self._lock:
                if self.terminal and self._drawn:
                    self._stream.write("\n")
                    self._stream.flush()
                    self._drawn = False
