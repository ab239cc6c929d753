"""The threads of an event source mapping: its poller thread and the batch threads it starts.

The poller thread is a SupervisedThread (tools/local/supervision.py): whatever escapes its loop is
reported and the loop resumes on the mapping's state. A batch thread that fails is reported the same
way; its records are not settled, so the mapping delivers them again (a stream lane retries the batch,
a queue's messages come back after their visibility timeout).

Both pollers (stream and queue) stop the same way: the poller thread first, then each batch still
being invoked, within one deadline, so a stopping stack never leaves an invocation half-settled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tools.local.supervision import SupervisedThread, describe_error


class MappingThreads(SupervisedThread):
    """Starts, stops and joins a mapping's poller thread and the batch threads it runs."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._batches: set[threading.Thread] = set()
        self._batches_lock = threading.Lock()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        super().join(timeout)
        with self._batches_lock:
            batches = list(self._batches)
        for batch in batches:
            batch.join(max(0.0, deadline - time.monotonic()))

    def _start_batch(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        """Runs target(*args) in a batch thread of its own, joined at stop."""

        def run() -> None:
            try:
                target(*args)
            except Exception as exc:  # noqa: BLE001 - the batch thread's edge: reported, its records come again
                if not self._stop.is_set():
                    error = describe_error(exc)
                    self.report(f"batch {name} failed: {error}; its records are delivered again")
            finally:
                with self._batches_lock:
                    self._batches.discard(threading.current_thread())

        batch = threading.Thread(target=run, name=name, daemon=True)
        with self._batches_lock:
            self._batches.add(batch)
        batch.start()
