"""How a function's worker process is started: a fresh interpreter, or a fork of the fork server.

A fresh interpreter per function pays for importing boto3, Powertools and friends every time (seconds
each on a small machine). The fork server (tools.local.runtime.forkserver) imports those once, with the
environment all the stack's functions share, and forks one worker per function; the fork then takes
exactly its function's environment before any of the function's code is imported.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tools.local.processes import ChildProcess
from tools.template import ROOT

# The fork server imports the shared packages before it answers its first request.
FORK_SERVER_TIMEOUT_SECONDS = 60.0
_GONE_POLL_SECONDS = 0.02
_KILL_WAIT_SECONDS = 5.0


class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class WorkerPipes:
    """The worker's ends of its three pipes (requests in, responses out, stdout+stderr out)."""

    request_read: int
    response_write: int
    output_write: int


class WorkerProcess(Protocol):
    @property
    def pid(self) -> int: ...

    def alive(self) -> bool: ...

    def exit_code(self) -> int | None: ...

    def kill(self) -> None: ...


class Launcher(Protocol):
    def launch(
        self, name: str, config: Mapping[str, Any], env: Mapping[str, str], pipes: WorkerPipes
    ) -> WorkerProcess: ...


class SubprocessLauncher:
    """Each worker is a new interpreter started with exactly its environment."""

    def launch(
        self, name: str, config: Mapping[str, Any], env: Mapping[str, str], pipes: WorkerPipes
    ) -> WorkerProcess:
        return ChildProcess(
            name,
            [
                sys.executable,
                "-m",
                "tools.local.runtime.worker",
                json.dumps(config),
                str(pipes.request_read),
                str(pipes.response_write),
            ],
            env=env,
            cwd=ROOT,
            stdout=pipes.output_write,
            pass_fds=(pipes.request_read, pipes.response_write),
            guard=False,  # the worker watches its parent itself (it may be respawned from any thread)
        )


class ForkedWorker:
    """A worker forked by the fork server: its own session, reaped by the fork server."""

    def __init__(self, pid: int) -> None:
        self._pid = pid

    @property
    def pid(self) -> int:
        return self._pid

    def alive(self) -> bool:
        try:
            os.kill(self._pid, 0)
        except ProcessLookupError:
            return False
        return True

    def exit_code(self) -> int | None:
        return None  # reaped by the fork server, which keeps no status

    def kill(self) -> None:
        try:
            os.killpg(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + _KILL_WAIT_SECONDS
        while self.alive() and time.monotonic() < deadline:
            time.sleep(_GONE_POLL_SECONDS)


class ForkServer:
    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self._env = dict(env)
        self._log_path = log_path
        self._lock = threading.Lock()
        self._control: socket.socket | None = None
        self.process: ChildProcess | None = None

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._log_path.open("ab") as log:
                self.process = ChildProcess(
                    "fork server",
                    [sys.executable, "-m", "tools.local.runtime.forkserver", str(theirs.fileno())],
                    env=self._env,
                    cwd=ROOT,
                    stdout=log,
                    pass_fds=(theirs.fileno(),),
                    guard=False,  # it exits when its control socket closes, i.e. with the stack
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._control = ours

    def launch(
        self, name: str, config: Mapping[str, Any], env: Mapping[str, str], pipes: WorkerPipes
    ) -> WorkerProcess:
        request = json.dumps({"name": name, "config": dict(config), "env": dict(env)}).encode()
        fds = [pipes.request_read, pipes.response_write, pipes.output_write]
        with self._lock:
            control = self._control
            if control is None:
                raise LaunchError("the fork server is not running")
            try:
                socket.send_fds(control, [request], fds)
                control.settimeout(FORK_SERVER_TIMEOUT_SECONDS)
                reply = control.recv(4096)
            except OSError as exc:  # TimeoutError included
                raise LaunchError(f"the fork server did not start {name}: {exc!r}") from exc
        if not reply:
            raise LaunchError(f"the fork server exited; see {self._log_path}")
        return ForkedWorker(int(json.loads(reply)["pid"]))

    def child_pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()  # the fork server exits on EOF
            self._control = None
        if self.process is not None:
            self.process.stop()


def shared_environment(environments: list[Mapping[str, str]]) -> dict[str, str]:
    """The variables (and values) that every one of these environments has."""
    if not environments:
        return {}
    first, *others = environments
    return {name: value for name, value in first.items() if all(e.get(name) == value for e in others)}
