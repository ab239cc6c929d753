"""The threads of an event source mapping: its poller thread and the batch threads it starts.

Both pollers (stream and queue) stop the same way: the poller thread first, then each batch still
being invoked, within one deadline, so a stopping stack never leaves an invocation half-settled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class MappingThreads:
    """Starts, stops and joins a mapping's poller thread and the batch threads it runs."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._batches: set[threading.Thread] = set()
        self._batches_lock = threading.Lock()

    def _run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._thread.join(timeout)
        with self._batches_lock:
            batches = list(self._batches)
        for batch in batches:
            batch.join(max(0.0, deadline - time.monotonic()))

    def _start_batch(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        """Runs target(*args) in a batch thread of its own, joined at stop."""

        def run() -> None:
            try:
                target(*args)
            finally:
                with self._batches_lock:
                    self._batches.discard(threading.current_thread())

        batch = threading.Thread(target=run, name=name, daemon=True)
        with self._batches_lock:
            self._batches.add(batch)
        batch.start()
