"""`python -m local`: run the local stack; `python -m local invoke FUNCTION EVENT`: run one function.

Settings come from the environment, as the Makefile passes them:
    PORT=3000          API port (0: any free port)
    PERSIST=1          keep DynamoDB data in .local-data/dynamodb between runs
    DYNAMODB_PORT, MOTO_PORT   fixed service ports (default: any free port)
    LOGS=1             also print the functions' own log lines
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from local.console import Console
from local.functions import FunctionRuntime, InvocationResult, function_environment
from local.processes import StartupError, accepts_connections
from local.services import Endpoints
from local.stack import DEFAULT_DATA_DIR, LocalStack, StackOptions
from local.summary import startup_summary
from local.template import Template, TemplateError

STATE_FILE = DEFAULT_DATA_DIR / "stack.json"
_WATCH_SECONDS = 0.5


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"error: {name} must be a number, got {raw!r}") from None


def _options() -> StackOptions:
    return StackOptions(
        api_port=_env_int("PORT", 3000),
        dynamodb_port=_env_int("DYNAMODB_PORT", 0),
        moto_port=_env_int("MOTO_PORT", 0),
        persist=os.environ.get("PERSIST", "") not in {"", "0"},
        echo_function_logs=os.environ.get("LOGS", "") not in {"", "0"},
    )


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run() -> int:
    console = Console()
    stack = LocalStack(options=_options(), console=console)
    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (e.g. from a script with &);
    # SIGTERM and SIGHUP unwind the same way, so the finally below stops every child.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGHUP, _raise_exit)
    console.print("starting the local stack (DynamoDB Local, moto, functions) …")
    try:
        stack.start()
    except (StartupError, TemplateError) as exc:
        console.print(console.paint(f"error: {exc}", "\033[31m"))
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        return _serve(stack, console)
    finally:
        console.print("stopping …")
        STATE_FILE.unlink(missing_ok=True)
        stack.stop()
        console.print("stopped.")


def _serve(stack: LocalStack, console: Console) -> int:
    """Show the summary, then watch the services until Ctrl-C (0) or a service dies (1)."""
    for line in startup_summary(stack, console):
        console.print(line)
    _write_state(stack)
    try:
        while stack.services.alive():
            time.sleep(_WATCH_SECONDS)
    except KeyboardInterrupt:
        return 0
    died = "error: a local service exited unexpectedly; see .local-data/logs"
    console.print(console.paint(died, "\033[31m"))
    return 1


def _write_state(stack: LocalStack) -> None:
    state = {
        "pid": os.getpid(),
        "stack_name": stack.template.stack_name,
        "endpoints": {"dynamodb": stack.endpoints.dynamodb, "moto": stack.endpoints.moto},
        "api_url": stack.api_url if stack.api is not None else None,
    }
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    STATE_FILE.write_text(json.dumps(state, indent=2))


def _running_stack(state_file: Path) -> dict[str, Any] | None:
    """The state of a running `make local`, if one is up (stale state files are ignored)."""
    try:
        state = json.loads(state_file.read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    ports = [int(url.rsplit(":", 1)[1]) for url in state["endpoints"].values()]
    return state if all(accepts_connections(port) for port in ports) else None


def _print_log_line(function: str, line: str) -> None:
    print(f"{function} | {line}", file=sys.stderr)


def invoke(function: str, event_path: Path, state_file: Path = STATE_FILE) -> int:
    template = Template.load()
    if function not in template.of_type("AWS::Serverless::Function"):
        names = ", ".join(template.of_type("AWS::Serverless::Function"))
        print(f"error: {function} is not a function of template.yaml (functions: {names})", file=sys.stderr)
        return 2
    event = json.loads(event_path.read_text())
    state = _running_stack(state_file)
    if state is not None:
        print(f"invoking {function} against the running local stack", file=sys.stderr)
        result = _invoke_against(template, function, event, Endpoints(**state["endpoints"]))
    else:
        print(f"no local stack is running: starting one for this call ({function})", file=sys.stderr)
        options = StackOptions(api_port=0, serve=False, only_functions=frozenset({function}))
        options.echo_function_logs = True
        with LocalStack(template, options, console=Console(sys.stderr)) as stack:
            result = stack.invoke(function, event)
    output = result.payload if result.ok else result.error.to_payload() if result.error else None
    print(json.dumps(output, indent=2))
    return 0 if result.ok else 1


def _invoke_against(template: Template, function: str, event: Any, endpoints: Endpoints) -> InvocationResult:
    spec = template.function(function)
    physical = template.physical_name(function)
    runtime = FunctionRuntime(
        spec,
        physical,
        function_environment(spec, physical, endpoints),
        DEFAULT_DATA_DIR / "logs" / f"{function}.invoke.log",
        echo=_print_log_line,
    )
    try:
        return runtime.invoke(event)
    finally:
        runtime.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m local", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("run", help="run the whole stack (the default)")
    invoke_parser = commands.add_parser("invoke", help="run one function with an event file")
    invoke_parser.add_argument("function", help="logical id of the function in template.yaml")
    invoke_parser.add_argument("event", type=Path, help="JSON event file, e.g. events/api_create_order.json")
    args = parser.parse_args(argv)
    try:
        if args.command == "invoke":
            return invoke(args.function, args.event)
        return run()
    except (StartupError, TemplateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
