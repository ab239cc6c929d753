"""The fault ledger: one JSON line per injected fault, appended by every worker and by the harness.

Appends hold an exclusive flock, so lines from concurrent processes never interleave.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any


class Ledger:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def append(self, kind: str, function: str, operation: str, **details: Any) -> None:
        entry = {"at": time.time(), "kind": kind, "function": function, "operation": operation, **details}
        line = json.dumps(entry, separators=(",", ":"), default=str) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.write(line)
                handle.flush()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open() as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                lines = handle.read().splitlines()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return [json.loads(line) for line in lines if line.strip()]

    def read_from(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        """The entries appended since byte `offset`, and the offset after them (the live line reads the
        ledger as it grows, not whole every time)."""
        if not self.path.exists():
            return [], offset
        with self.path.open("rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                handle.seek(offset)
                data = handle.read()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return [json.loads(line) for line in data.splitlines() if line.strip()], offset + len(data)

    def counts(self) -> Counter[str]:
        return Counter(entry["kind"] for entry in self.entries())
