"""Test-only stacks for the conformance tests, and a way to keep a function's reserved concurrency in use.

A test-only stack is a template of a few resources whose functions' code the test module writes to a
temporary directory; it runs on the session's `local_services` (tests/conftest.py) and is stopped with
every process it started checked gone.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.local_stacks import start_stack, stop_stack
from tools.local.runtime.functions import InvocationResult
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import Template

HOLD_SECONDS_LIMIT = 30

# A handler that holds its execution environment when invoked directly with {"hold": seconds, "started":
# path} (it creates the file once it runs, so the caller knows the environment is taken), and otherwise
# processes a batch: an SQS message whose body is {"sleep": seconds} takes that long.
HOLDING_HANDLER = """
import json
import time
from pathlib import Path


def handler(event, context):
    if "hold" in event:
        Path(event["started"]).touch()
        time.sleep(event["hold"])
        return {"held": event["hold"]}
    for record in event["Records"]:
        body = record.get("body", "")
        if body.startswith("{"):
            time.sleep(json.loads(body).get("sleep", 0))
    return {"batchItemFailures": []}
"""
HOLDING_MODULE = "holding"


def function_resource(code_dir: Path, events: dict[str, Any], **properties: Any) -> dict[str, Any]:
    """A function of the holding handler (python3.13), with these events and properties."""
    return {
        "Type": "AWS::Serverless::Function",
        "Properties": {
            "CodeUri": str(code_dir),
            "Handler": f"{HOLDING_MODULE}.handler",
            "Runtime": "python3.13",
            "Timeout": 10,
            "Events": events,
            **properties,
        },
    }


@contextlib.contextmanager
def running_stack(
    name: str,
    resources: Callable[[Path], dict[str, Any]],
    modules: dict[str, str],
    local_services: LocalServices,
    tmp_path_factory: pytest.TempPathFactory,
    **options: Any,
) -> Iterator[LocalStack]:
    """Start the stack `name` of resources(code_dir), with code_dir holding these modules (name → source);
    `options` go to StackOptions."""
    code_dir = tmp_path_factory.mktemp(f"{name}-code")
    for module, source in modules.items():
        (code_dir / f"{module}.py").write_text(source)
    template = Template({"Resources": resources(code_dir)}, stack_name=name)
    stack_options = StackOptions(
        api_port=0, data_dir=tmp_path_factory.mktemp(f"{name}-stack"), seed_file=None, **options
    )
    stack = start_stack(template, stack_options, local_services)
    try:
        yield stack
    finally:
        stop_stack(stack)


def stack_fixture(
    name: str, resources: Callable[[Path], dict[str, Any]], modules: dict[str, str] | None = None
) -> Any:
    """A module-scoped fixture of the running stack `name` (running_stack), its code the holding handler
    unless `modules` say otherwise: assign it to the fixture's name in the test module."""

    @pytest.fixture(scope="module")
    def stack(
        local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[LocalStack]:
        code = modules or {HOLDING_MODULE: HOLDING_HANDLER}
        with running_stack(name, resources, code, local_services, tmp_path_factory) as running:
            yield running

    return stack


@contextlib.contextmanager
def reserved_concurrency_in_use(
    stack: LocalStack, function: str, seconds: float, marker_dir: Path
) -> Iterator[list[InvocationResult]]:
    """Direct invocations of `function` (a holding handler) take all of its reserved concurrency for
    `seconds`; the block runs once they are all running. Their results are in the yielded list after it."""
    reserved = stack.template.function(function).reserved_concurrency
    assert reserved, f"{function} reserves no concurrency to hold"
    assert seconds < HOLD_SECONDS_LIMIT
    results: list[InvocationResult] = []
    markers = [marker_dir / f"{function}-{n}-{threading.get_ident()}" for n in range(reserved)]

    def hold(marker: Path) -> None:
        results.append(stack.invoke(function, {"hold": seconds, "started": str(marker)}))

    holders = [threading.Thread(target=hold, args=(marker,), daemon=True) for marker in markers]
    for holder in holders:
        holder.start()
    stack.wait_for(lambda: all(m.exists() for m in markers), 10, f"{function}'s environments taken")
    try:
        yield results
    finally:
        for holder in holders:
            holder.join(HOLD_SECONDS_LIMIT)
