"""SAM CLI's local commands accept the template exactly as committed, for both order stores.

The commands a SAM user runs after `make build` (which `make test` runs before these tests):
`sam local invoke <Function> -e events/<file>.json`, `sam local start-api`, `sam local start-lambda`, with
`--parameter-overrides OrderStore=postgres` too. Two layers:
- as users run them (a subprocess, SAM's own exit): without a container runtime SAM must stop with its own
  "requires a container runtime" message and nothing else; with one, the invocation must run;
- in process up to the container (tests/support/sam_local.py): SAM CLI's code reads the template, finds
  the function, resolves its code, layers, runtime and environment, and would run exactly that; start-api
  mounts the API's routes and start-lambda serves every function.
Any template SAM CLI refuses (an Fn::ForEach in Resources, an intrinsic where SAM CLI reads a plain value,
an unknown function) fails them: `Plugin 'ServerlessAppPlugin' raised an exception` before; a TypeError in
start-api's authorizer lookup (`DefaultAuthorizer: !If`) after the loops were gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import SAMPLE_EVENTS
from tests.support.sam_local import NO_CONTAINER_RUNTIME, SamRun, Service, recording_sam
from tools.template import ROOT, Template

SAM = str(Path(sys.executable).with_name("sam"))
BUILD = ROOT / ".aws-sam" / "build"
STORES = {"dynamodb": [], "postgres": ["--parameter-overrides", "OrderStore=postgres"]}


@pytest.fixture(scope="module")
def templates() -> dict[str, Template]:
    if not (BUILD / "template.yaml").is_file():
        pytest.fail("no build output: run `make build` (make test does it before these tests)")
    return {store: Template.load(parameters={"OrderStore": store}) for store in STORES}


@pytest.fixture(scope="module")
def sam(templates: dict[str, Template]) -> Iterator[Callable[[list[str]], SamRun]]:
    cwd = Path.cwd()
    os.chdir(ROOT)  # SAM CLI finds .aws-sam/build and samconfig.toml from the working directory, as a user's
    try:
        with recording_sam() as run:
            yield run
    finally:
        os.chdir(cwd)


def test_every_function_has_sample_events_and_every_event_a_function(templates: dict[str, Template]):
    functions = {name for template in templates.values() for name in template.functions()}
    assert set(SAMPLE_EVENTS) == functions
    listed = {event for events in SAMPLE_EVENTS.values() for event in events}
    assert listed == {path.name for path in (ROOT / "events").glob("*.json")}


def _container_runtime_answers() -> bool:
    docker = shutil.which("docker") or shutil.which("finch")
    return (
        docker is not None
        and subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0
    )


def test_sam_local_invoke_as_users_run_it_stops_only_at_the_container_runtime():
    # SAM checks for a container runtime before it looks the function up, so one command per store says
    # all this layer can say: the template was read (the loops' crash came first) and nothing else failed.
    runtime = _container_runtime_answers()
    commands = [
        [SAM, "local", "invoke", "OrdersApiFunction", "-e", "events/api_create_order.json"],
        [
            SAM,
            "local",
            "invoke",
            "OutboxPublisherFunction",
            "-e",
            "events/scheduler_tick.json",
            *STORES["postgres"],
        ],
    ]
    env = {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1"}

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(run, commands))
    for command, result in zip(commands, results, strict=True):
        said = result.stdout + result.stderr
        where = " ".join(command[1:])
        assert "Traceback" not in said, f"{where}:\n{said}"
        assert "raised an exception" not in said, f"{where}:\n{said}"
        if runtime:  # a Docker or Finch user: the function runs in its container
            assert result.returncode == 0, f"{where}:\n{said}"
            assert "END RequestId" in said, f"{where}:\n{said}"
        else:
            assert result.returncode == 1, f"{where}:\n{said}"
            assert said.strip().splitlines()[-1] == f"Error: {NO_CONTAINER_RUNTIME}", f"{where}:\n{said}"


@pytest.mark.parametrize("store", STORES)
def test_sam_local_invoke_runs_each_function_as_built_with_each_sample_event(
    store: str, templates: dict[str, Template], sam: Callable[[list[str]], SamRun]
):
    template = templates[store]
    for function, spec in template.functions().items():
        for event in SAMPLE_EVENTS[function]:
            run = sam(["local", "invoke", function, "-e", f"events/{event}", *STORES[store]])
            assert run.error is None, f"{function} {event}: {run.error!r}"
            [invocation] = run.invocations
            assert invocation.function == function
            assert (invocation.runtime, invocation.architecture) == ("python3.13", "arm64")
            assert invocation.handler == spec.handler
            assert Path(invocation.code) == BUILD / function  # what `sam build` made, not the source
            assert invocation.layers == ["SharedLayer"]
            assert invocation.event == json.loads((ROOT / "events" / event).read_text())
            # every variable the template gives the function reaches its container
            assert set(spec.environment) <= set(invocation.environment), function
            assert invocation.environment["ORDER_STORE"] == store


def test_sam_local_invoke_refuses_an_unknown_function(sam: Callable[[list[str]], SamRun]):
    run = sam(["local", "invoke", "NoSuchFunction", "-e", "events/scheduler_tick.json"])
    assert run.invocations == []
    assert "NoSuchFunction not found" in str(run.error)


def started_service(sam: Callable[[list[str]], SamRun], command: str, store: str) -> Service:
    """The one service `sam local <command>` starts on the store's template (it must start without error)."""
    run = sam(["local", command, *STORES[store]])
    assert run.error is None, repr(run.error)
    [service] = run.services
    return service


@pytest.mark.parametrize("store", STORES)
def test_sam_local_start_api_mounts_every_route_of_the_api(
    store: str, templates: dict[str, Template], sam: Callable[[list[str]], SamRun]
):
    service = started_service(sam, "start-api", store)
    expected = {
        (name, props["Path"], (props["Method"].upper(),))
        for name, spec in templates[store].functions().items()
        for props in (event["Properties"] for event in spec.events.values() if event["Type"] == "Api")
    }
    assert expected, "the template has no API route"
    assert set(service.routes) == expected


@pytest.mark.parametrize("store", STORES)
def test_sam_local_start_lambda_serves_every_function(
    store: str, templates: dict[str, Template], sam: Callable[[list[str]], SamRun]
):
    service = started_service(sam, "start-lambda", store)
    assert set(service.functions) == set(templates[store].functions())
