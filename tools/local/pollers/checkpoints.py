"""Stream positions of the event source mappings, kept across restarts when the data is (PERSIST=1).

An event source mapping in the cloud remembers where it is in each shard; without this, a restarted
local stack would read its persisted tables' streams again from the start and redeliver everything.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path


class CheckpointStore:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        try:
            loaded = json.loads(path.read_text())
        except FileNotFoundError:
            loaded = {}
        self._positions: dict[str, str] = {str(k): str(v) for k, v in loaded.items()}

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._positions.get(key)

    def put(self, key: str, sequence_number: str) -> None:
        with self._lock:
            self._positions[key] = sequence_number
            # Write-then-rename: a crash never leaves a half-written file.
            scratch = self._path.with_suffix(".tmp")
            scratch.parent.mkdir(parents=True, exist_ok=True)
            scratch.write_text(json.dumps(self._positions, indent=1, sort_keys=True))
            scratch.replace(self._path)
