"""Exec a command that the kernel kills when the local stack's process dies, even by SIGKILL.

Run as a script (`python tools/local/orphan_guard.py CMD ARGS...`), so it needs nothing but the stdlib.
PR_SET_PDEATHSIG survives exec; it fires when the thread that started this process exits, so the
stack starts its long-lived children from its main thread.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent goes away (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # The parent may already have died between fork and prctl.
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        sys.exit("usage: orphan_guard.py PARENT_PID COMMAND [ARGS...]")
    die_with_parent(int(argv[1]))
    os.execvp(argv[2], argv[2:])  # noqa: S606 - argv is the stack's own command line, no shell


if __name__ == "__main__":
    main(sys.argv)
