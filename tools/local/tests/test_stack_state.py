"""Stacks per port (tools/local/stack_state.py): each running stack keeps its own state directory, a second
stack cannot take over a running one's, and `make invoke` and `python -m operations --local` read the
state of the port they are pointed at. On running stacks: tests/integration/test_stacks_per_port.py.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import tools.local.__main__ as local_main
from operations import local_stack as operations_local
from tools.local import stack_state
from tools.local.pollers.event_sources import read_event_sources
from tools.local.processes import StartupError
from tools.local.runtime.functions import forced_environment
from tools.local.services.emulators import Endpoints
from tools.local.stack import DEFAULT_DATA_DIR, LocalStack
from tools.local.stack_state import (
    StateLock,
    remove_state,
    running_ports,
    running_stack,
    state_dir,
    state_file,
)
from tools.template import Template


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port something listens on, as a running stack's services do."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def write(path: Path, pid: int, port: int, **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    endpoints = {"dynamodb": f"http://127.0.0.1:{port}", "moto": f"http://127.0.0.1:{port}"}
    path.write_text(json.dumps({"pid": pid, "stack_name": f"s{pid}", "endpoints": endpoints, **extra}))


def test_the_default_port_keeps_local_data_and_any_other_port_a_directory_of_its_own(tmp_path: Path) -> None:
    assert state_dir(3000, tmp_path) == tmp_path
    assert state_file(3000, tmp_path) == tmp_path / "stack.json"
    assert state_dir(3001, tmp_path) == tmp_path / "port-3001"
    assert stack_state.STATE_ROOT == DEFAULT_DATA_DIR, "the default port's state is where it always was"
    for port in (3000, 3001, 8080):
        # The operator commands find a stack by the same rule, without importing the local stack.
        assert operations_local.state_path(port, tmp_path) == state_file(port, tmp_path)
    assert operations_local.STATE_ROOT == stack_state.STATE_ROOT


def test_stopping_one_stack_leaves_the_other_ports_state(tmp_path: Path, listening_port: int) -> None:
    ours, theirs = state_file(3001, tmp_path), state_file(3000, tmp_path)
    other_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        write(ours, os.getpid(), listening_port)
        write(theirs, other_process.pid, listening_port)

        remove_state(ours)
        remove_state(theirs)  # a file of another stack's process is never removed

        assert not ours.exists()
        assert running_stack(theirs) is not None
        assert running_ports(tmp_path) == [3000]
    finally:
        other_process.kill()
        other_process.wait()
    assert running_stack(theirs) is None, "a stale file of a stack that is gone is ignored"


def test_a_second_stack_cannot_start_from_a_running_ones_directory(tmp_path: Path) -> None:
    first = StateLock(state_dir(3001, tmp_path))
    first.acquire()
    try:
        with pytest.raises(StartupError, match=rf"process {os.getpid()}\) already runs from .*port-3001"):
            StateLock(state_dir(3001, tmp_path)).acquire()
        with StateLock(state_dir(3002, tmp_path)):
            pass  # another port, another directory
    finally:
        first.release()
    with StateLock(state_dir(3001, tmp_path)):
        pass  # free once the first stopped


def test_make_invoke_reads_the_state_of_port(
    tmp_path: Path, listening_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stack_state, "STATE_ROOT", tmp_path)
    write(state_file(3001, tmp_path), os.getpid(), listening_port)
    asked: list[Path] = []

    def invoke(function: str, event: Path, state: Path) -> int:
        asked.append(state)
        return 0

    monkeypatch.setattr(local_main, "invoke", invoke)

    monkeypatch.setenv("PORT", "3001")
    local_main._invoke("OrdersApiFunction", Path("events/api_get_order.json"))
    monkeypatch.delenv("PORT")
    local_main._invoke("OrdersApiFunction", Path("events/api_get_order.json"))

    assert asked == [tmp_path / "port-3001" / "stack.json", tmp_path / "stack.json"]
    assert (
        "note: no local stack on port 3000; one runs on 3001 (PORT=3001 to use it)" in capsys.readouterr().err
    )


# --- python -m operations --local ---------------------------------------------------------------------------
def namespace(command: str, **values: Any) -> argparse.Namespace:
    return argparse.Namespace(command=command, stack_name=None, **values)


def test_the_operator_commands_take_the_outputs_and_endpoints_of_the_stack_on_port(
    tmp_path: Path, listening_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = {
        "AWS_ENDPOINT_URL_SQS": f"http://127.0.0.1:{listening_port}",
        "AWS_ENDPOINT_URL_LAMBDA": f"http://127.0.0.1:{listening_port}",  # the maintenance function's
        "AWS_ACCESS_KEY_ID": "local",
    }
    for name in environment:
        monkeypatch.setenv(name, "before")  # restored after the test
    outputs = {"RelayPoisonQueueUrl": "http://127.0.0.1/123456789012/s-RelayPoisonQueue"}
    write(
        state_file(3001, tmp_path),
        os.getpid(),
        listening_port,
        outputs=outputs,
        operator_environment=environment,
    )
    monkeypatch.setenv("PORT", "3001")
    args = namespace("redrive-poison", event_id=None)

    operations_local.use_local_stack(args, tmp_path)

    assert args.stack_name == f"s{os.getpid()}"
    assert operations_local.outputs(args.stack_name) == outputs
    assert {name: os.environ[name] for name in environment} == environment


def test_without_a_stack_on_port_the_operator_commands_say_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PORT", "3005")

    with pytest.raises(SystemExit, match=r"no local stack runs on port 3005 .*\(make local PORT=3005\)"):
        operations_local.use_local_stack(namespace("redrive"), tmp_path)


def fake_stack(order_store: str, serving: bool) -> LocalStack:
    """What stack_state reads of a stack: its template, endpoints, queue URLs and (serving) its API."""
    template = Template.load(parameters={"OrderStore": order_store})
    api = SimpleNamespace(port=3000) if serving else None
    stack = SimpleNamespace(
        template=template,
        sources=read_event_sources(template),
        endpoints=Endpoints(dynamodb="http://127.0.0.1:8000", moto="http://127.0.0.1:5000"),
        api=api,
        api_url="http://127.0.0.1:3000",
        queue_url=lambda queue: f"http://127.0.0.1:5000/123456789012/{queue}",
    )
    return cast(LocalStack, stack)


@pytest.mark.parametrize("order_store", ["postgres", "dynamodb"])
def test_a_serving_stack_names_its_functions_and_points_the_commands_lambda_clients_at_its_api(
    order_store: str,
) -> None:
    """The state names the functions (OrderStore=postgres: the maintenance function too) with the Lambda
    endpoint to invoke them at, and STS on moto (discard-poison asks who the caller is); the functions'
    own environment is unchanged (none of them calls Lambda or STS)."""
    stack = fake_stack(order_store, serving=True)

    outputs = stack_state.local_outputs(stack)
    environment = stack_state.operator_environment(stack)

    assert outputs["OrdersApiFunctionName"] == stack.template.physical_name("OrdersApiFunction")
    assert ("OrderStoreMaintenanceFunctionName" in outputs) is (order_store == "postgres")
    assert environment["AWS_ENDPOINT_URL_LAMBDA"] == "http://127.0.0.1:3000"
    assert environment["AWS_ENDPOINT_URL_STS"] == "http://127.0.0.1:5000"
    assert not {"AWS_ENDPOINT_URL_LAMBDA", "AWS_ENDPOINT_URL_STS"} & set(forced_environment(stack.endpoints))


def test_a_stack_without_its_api_names_no_function_for_a_command_to_invoke_elsewhere() -> None:
    stack = fake_stack("postgres", serving=False)

    assert not [name for name in stack_state.local_outputs(stack) if name.endswith("FunctionName")]
    assert "AWS_ENDPOINT_URL_LAMBDA" not in stack_state.operator_environment(stack)
