"""The fork server: imports the functions' heavy third-party packages once, then forks a worker per request.

Started by tools.local.runtime.launchers.ForkServer as
`python -m tools.local.runtime.forkserver CONTROL_FD` with the environment every function of the
stack shares. Each request (on a SOCK_SEQPACKET socket) carries a worker's config, its complete
environment and its three pipe ends; the fork takes that environment, sets up its pipes and runs
tools.local.runtime.worker.serve(), which imports the function's own code. The fork server never
starts a thread, so forking is safe, and it exits when the stack closes the control socket.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Any, NoReturn

from tools.local.runtime import worker

# Imported once here instead of once per function. A package that is not installed is skipped.
PRELOADED_MODULES = (
    "boto3",
    "botocore.session",
    "botocore.client",
    "pydantic",
    "aws_xray_sdk.core",
    "aws_lambda_powertools",
    "aws_lambda_powertools.logging",
    "aws_lambda_powertools.metrics",
    "aws_lambda_powertools.tracing",
    "aws_lambda_powertools.event_handler",
    "aws_lambda_powertools.utilities.batch",
    "aws_lambda_powertools.utilities.idempotency",
    "aws_lambda_powertools.utilities.parser",
    "aws_lambda_powertools.utilities.typing",
)
_MAX_REQUEST_BYTES = 1 << 20


def _preload() -> None:
    for name in PRELOADED_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if threading.active_count() != 1:
        print(f"fork server: {threading.active_count()} threads after preloading; forks may hang", flush=True)


def _become_worker(request: dict[str, Any], fds: list[int]) -> NoReturn:
    request_fd, response_fd, output_fd = fds
    os.setsid()  # its own process group, so the stack can kill it and whatever it starts
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.close(output_fd)
    os.environ.clear()
    os.environ.update(request["env"])
    code = 1
    try:
        worker.serve(request["config"], request_fd, response_fd)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - process boundary: report why the environment ended
        traceback.print_exc()
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[1]))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps finished workers
    _preload()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, _MAX_REQUEST_BYTES, 3)
        except OSError:
            break
        if not message:
            break  # the stack closed the socket (stopped or died)
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            control.close()
            _become_worker(request, fds)
        for fd in fds:
            os.close(fd)
        control.send(json.dumps({"pid": pid}).encode())


if __name__ == "__main__":
    main(sys.argv)
