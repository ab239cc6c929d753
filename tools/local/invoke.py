"""`make invoke`: run one function with an event file, against the running local stack if there is one.

The running `make local` writes its endpoints to the state file of its port (tools/local/stack_state.py;
`python -m tools.local invoke` is given the one of PORT); an invocation then runs the function
in a fresh environment of its own, pointed at those services (like `sam local invoke -e` against a
shared backend). Without a running stack, one is started for the call (services, resources, seeds,
that one function) and stopped afterwards. Either way, the orders the event names are written first
where the stack lacks them (invoke_seeds.py), so that what the function writes goes through the saga
instead of into a dead-letter queue. An event file that is missing or not JSON is one line, exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tools.local.console.render import Console
from tools.local.invoke_seeds import seed_named_orders
from tools.local.parameters import PARAMETER_VARIABLES, chosen_parameters, chosen_template, needed_for
from tools.local.runtime.functions import FunctionRuntime, InvocationResult, function_environment
from tools.local.services.emulators import Endpoints
from tools.local.stack import LocalStack, StackOptions
from tools.local.stack_state import running_stack
from tools.template import Template


def _print_log_line(function: str, line: str) -> None:
    print(f"{function} | {line}", file=sys.stderr)


def _say(line: str) -> None:
    print(line, file=sys.stderr)


class EventFileError(Exception):
    """The event file cannot be read as JSON; the message says why, in one line."""


def read_event(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EventFileError(f"no event file {path}") from None
    except IsADirectoryError:
        raise EventFileError(f"{path} is a directory, not an event file") from None
    except UnicodeDecodeError as exc:
        raise EventFileError(f"{path} is not JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise EventFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError says where; an integer past the digit limit says that
        raise EventFileError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise EventFileError(f"{path} is not JSON this reader can take: nested too deep") from None


def _invoke_against(state: dict[str, Any], template: Template, function: str, event: Any) -> InvocationResult:
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


def _refusal(function: str, template: Template, state: dict[str, Any] | None) -> str | None:
    """Why `function` cannot be invoked on this template (one line), or None. The running stack's
    parameters are its own: ones the environment chooses otherwise are refused, not ignored."""
    functions = template.of_type("AWS::Serverless::Function")
    if function not in functions:
        return f"{function} is not a function of template.yaml (functions: {', '.join(functions)})"
    current = " ".join(
        f"{parameter}={template.parameter_values[parameter]}" for parameter in PARAMETER_VARIABLES.values()
    )
    if state is not None:
        other = {p: v for p, v in chosen_parameters().items() if template.parameter_values[p] != v}
        if other:
            asked = " ".join(f"{v}={other[p]}" for v, p in PARAMETER_VARIABLES.items() if p in other)
            return f"the running local stack has {current}, not {asked}: stop it first, or leave {asked} out"
    if not template.is_created(function):
        needs = needed_for(template, function)
        where = "the running local stack has" if state is not None else "these parameters are"
        return f"{function} needs {needs or 'other template parameters'} ({where} {current})"
    return None


def invoke(function: str, event_path: Path, state_file: Path) -> int:
    """Print the function's response (or error document) as JSON; exit status 1 on a function error.
    The template is the running stack's, or else the one the environment's ORDER_STORE and
    POSTGRES_RELAY choose (tools/local/parameters.py), as `make local` builds it."""
    state = running_stack(state_file)
    if state is not None:
        template = Template.load(
            stack_name=str(state["stack_name"]),
            parameters=state.get("parameters"),
            application_outputs=state.get("application_outputs"),
        )
    else:
        template = chosen_template()
    refusal = _refusal(function, template, state)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    try:
        event = read_event(event_path)
    except EventFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if state is not None:
        print(f"invoking {function} against the running local stack", file=sys.stderr)
        seed_named_orders(event, event_path, template, Endpoints(**state["endpoints"]), _say)
        result = _invoke_against(state, template, function, event)
    else:
        print(f"no local stack is running: starting one for this call ({function})", file=sys.stderr)
        options = StackOptions(
            api_port=0,
            serve=False,
            only_functions=frozenset({function}),
            echo_function_logs=True,
            data_dir=state_file.parent,  # the state directory of the port asked for, not another stack's
        )
        with LocalStack(template, options, console=Console(sys.stderr)) as stack:
            seed_named_orders(event, event_path, stack.template, stack.endpoints, _say)
            result = stack.invoke(function, event)
    output = result.error.to_payload() if result.error is not None else result.payload
    print(json.dumps(output, indent=2))
    return 0 if result.ok else 1
