"""A CPU sampling profiler for the stack's Python processes (no py-spy needed), off unless asked for.

With LOCAL_PROFILE_DIR set, the stack's process, moto server and every function worker sample their
threads' stacks every few milliseconds and charge each thread's CPU time used since the previous sample
(its own CPU clock, so threads waiting in select or on a lock cost nothing) to the stack it is in. The
counts are written every few seconds to LOCAL_PROFILE_DIR/<name>-<pid>.folded as folded stacks
("frame;frame;frame microseconds", what flame graph tools read): workers are killed, not stopped, so
nothing waits for an exit. `python -m tools.local.sampler DIR` prints the top functions by self and
inclusive CPU per process kind.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

PROFILE_DIR_VARIABLE = "LOCAL_PROFILE_DIR"
_INTERVAL_SECONDS = 0.005
_WRITE_EVERY_SECONDS = 2.0
_MAX_DEPTH = 60


def _frames(frame: object) -> str:
    names: list[str] = []
    while frame is not None and len(names) < _MAX_DEPTH:
        code = frame.f_code  # type: ignore[attr-defined]
        names.append(f"{Path(code.co_filename).name}:{code.co_name}")
        frame = frame.f_back  # type: ignore[attr-defined]
    return ";".join(reversed(names))


def start(name: str) -> None:
    """Sample this process from a daemon thread when LOCAL_PROFILE_DIR is set (after a fork, too)."""
    directory = os.environ.get(PROFILE_DIR_VARIABLE)
    if not directory:
        return
    path = Path(directory) / f"{name}-{os.getpid()}.folded"
    path.parent.mkdir(parents=True, exist_ok=True)
    threading.Thread(target=_sample, args=(path,), name="sampler", daemon=True).start()


def _sample(path: Path) -> None:
    me = threading.get_ident()
    used: Counter[str] = Counter()
    last_cpu: dict[int, float] = {}
    next_write = time.monotonic() + _WRITE_EVERY_SECONDS
    while True:
        time.sleep(_INTERVAL_SECONDS)
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            try:
                cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, ValueError):
                continue
            delta = cpu - last_cpu.get(ident, cpu)
            last_cpu[ident] = cpu
            if delta > 0:
                used[_frames(frame)] += round(delta * 1e6)
        if time.monotonic() >= next_write:
            next_write = time.monotonic() + _WRITE_EVERY_SECONDS
            temporary = path.with_suffix(".tmp")
            temporary.write_text("".join(f"{stack} {us}\n" for stack, us in used.items()))
            temporary.replace(path)


def report(directory: Path, top: int = 25) -> str:
    """The top functions by self and inclusive CPU, per kind of process (the file name before the pid)."""
    kinds: dict[str, list[Path]] = {}
    for path in sorted(directory.glob("*.folded")):
        kinds.setdefault(path.stem.rsplit("-", 1)[0], []).append(path)
    lines = []
    for kind, paths in kinds.items():
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        total = 0
        for path in paths:
            for line in path.read_text().splitlines():
                stack, _, us = line.rpartition(" ")
                frames = stack.split(";")
                total += int(us)
                own[frames[-1]] += int(us)
                for frame in set(frames):
                    inclusive[frame] += int(us)
        lines.append(f"== {kind}: {total / 1e6:.1f} CPU s sampled in {len(paths)} process(es)")
        lines.append("  self:")
        lines += [f"    {us / total:6.1%}  {frame}" for frame, us in own.most_common(top)]
        lines.append("  inclusive:")
        lines += [f"    {us / total:6.1%}  {frame}" for frame, us in inclusive.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25))
