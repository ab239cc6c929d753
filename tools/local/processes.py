"""Child processes and ports of the local stack.

Every child runs in its own process group (so stopping it also stops anything it started) and is
registered here, so an atexit hook stops whatever is still running if the stack exits abnormally.
"""

from __future__ import annotations

import atexit
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

LOOPBACK = "127.0.0.1"
_ORPHAN_GUARD = Path(__file__).with_name("orphan_guard.py")


class StartupError(RuntimeError):
    """The local stack cannot start; the message says why and what to do."""


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def ensure_port_free(port: int, purpose: str) -> None:
    """Fail fast and clearly when a port is taken, instead of a child dying with a bind error later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR ignores TIME_WAIT leftovers but still fails on a live listener.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))  # DynamoDB Local listens on every interface
        except OSError as exc:
            if exc.errno in {errno.EADDRINUSE, errno.EACCES}:
                raise StartupError(
                    f"port {port} for {purpose} is already in use; stop what holds it "
                    f"(e.g. `ss -ltnp 'sport = :{port}'`) or choose another port"
                ) from exc
            raise


def accepts_connections(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=timeout):
            return True
    except OSError:
        return False


class ChildProcess:
    """A child in its own process group that dies with the stack's process."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stdout: int | IO[bytes] | None = None,
        pass_fds: Sequence[int] = (),
        guard: bool = True,
    ) -> None:
        self.name = name
        command = [sys.executable, str(_ORPHAN_GUARD), str(os.getpid()), *argv] if guard else list(argv)
        self.popen = subprocess.Popen(
            command,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not None else None,
            pass_fds=tuple(pass_fds),
            start_new_session=True,  # own process group: Ctrl-C in the terminal reaches only the stack
        )
        _live_children.add(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def stop(self, grace_seconds: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period, and reap the child."""
        try:
            if self.alive():
                self._signal_group(signal.SIGTERM)
                try:
                    self.popen.wait(timeout=grace_seconds)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self.popen.wait(timeout=grace_seconds)
            # Grandchildren left in the group (if any) go too.
            self._signal_group(signal.SIGKILL)
        finally:
            _live_children.discard(self)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=5)
        finally:
            _live_children.discard(self)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.popen.pid, signum)
        except ProcessLookupError:
            pass  # already gone
        except PermissionError:
            pass  # the group id was reused by someone else's process: not ours to signal


class _ChildRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: set[ChildProcess] = set()

    def add(self, child: ChildProcess) -> None:
        with self._lock:
            self._children.add(child)

    def discard(self, child: ChildProcess) -> None:
        with self._lock:
            self._children.discard(child)

    def snapshot(self) -> list[ChildProcess]:
        with self._lock:
            return list(self._children)


_live_children = _ChildRegistry()


def live_children() -> list[ChildProcess]:
    """Children started by this process and not stopped yet."""
    return [child for child in _live_children.snapshot() if child.alive()]


@atexit.register
def _stop_leftover_children() -> None:
    for child in _live_children.snapshot():
        child.stop(grace_seconds=2.0)
