"""`make invoke`: run one function with an event file, against the running local stack if there is one.

The running `make local` writes its endpoints to a state file; an invocation then runs the function
in a fresh environment of its own, pointed at those services (like `sam local invoke -e` against a
shared backend). Without a running stack, one is started for the call (services, resources, seeds,
that one function) and stopped afterwards.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tools.local.console.render import Console
from tools.local.processes import accepts_connections
from tools.local.runtime.functions import FunctionRuntime, InvocationResult, function_environment
from tools.local.services.emulators import Endpoints
from tools.local.stack import LocalStack, StackOptions
from tools.template import Template


def write_state(stack: LocalStack, path: Path) -> None:
    """Record a running stack's endpoints, so `make invoke` can use its services."""
    state = {
        "pid": os.getpid(),
        "stack_name": stack.template.stack_name,
        "data_dir": str(stack.options.data_dir),
        "endpoints": {"dynamodb": stack.endpoints.dynamodb, "moto": stack.endpoints.moto},
        "api_url": stack.api_url if stack.api is not None else None,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2))


def running_stack(path: Path) -> dict[str, Any] | None:
    """The state of a running stack, if one is up (a stale file from a killed stack is ignored)."""
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
        ports = [int(url.rsplit(":", 1)[1]) for url in state["endpoints"].values()]
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return state if all(accepts_connections(port) for port in ports) else None


def _print_log_line(function: str, line: str) -> None:
    print(f"{function} | {line}", file=sys.stderr)


def _invoke_against(state: dict[str, Any], function: str, event: Any) -> InvocationResult:
    template = Template.load(stack_name=str(state["stack_name"]))
    spec = template.function(function)
    physical = template.physical_name(function)
    runtime = FunctionRuntime(
        spec,
        physical,
        function_environment(spec, physical, Endpoints(**state["endpoints"])),
        Path(state["data_dir"]) / "logs" / f"{function}.invoke.log",
        echo=_print_log_line,
    )
    try:
        return runtime.invoke(event)
    finally:
        runtime.stop()


def invoke(function: str, event_path: Path, state_file: Path) -> int:
    """Print the function's response (or error document) as JSON; exit status 1 on a function error."""
    template = Template.load()
    functions = template.of_type("AWS::Serverless::Function")
    if function not in functions:
        print(
            f"error: {function} is not a function of template.yaml (functions: {', '.join(functions)})",
            file=sys.stderr,
        )
        return 2
    event = json.loads(event_path.read_text())
    state = running_stack(state_file)
    if state is not None:
        print(f"invoking {function} against the running local stack", file=sys.stderr)
        result = _invoke_against(state, function, event)
    else:
        print(f"no local stack is running: starting one for this call ({function})", file=sys.stderr)
        options = StackOptions(
            api_port=0, serve=False, only_functions=frozenset({function}), echo_function_logs=True
        )
        with LocalStack(template, options, console=Console(sys.stderr)) as stack:
            result = stack.invoke(function, event)
    output = result.error.to_payload() if result.error is not None else result.payload
    print(json.dumps(output, indent=2))
    return 0 if result.ok else 1
