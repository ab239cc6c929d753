"""The docker-free local stack for the integration tests, started once per session on free ports.

- `local_services`: DynamoDB Local and moto server, shared by every stack of the session.
- `local_stack`: template.yaml exactly as `make local` runs it (seeded, API on a free port).
- `probe_stack`: template.yaml plus the test-only resources of probe/fragment.yaml (stack name
  "probe", only the probe functions started), for the event source semantics.
Each fixture stops what it started and asserts that none of its processes is left.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from local.processes import live_children
from local.services import LocalServices
from local.stack import LocalStack, StackOptions
from local.template import Template, load_yaml

PROBE_FRAGMENT = Path(__file__).with_name("probe") / "fragment.yaml"
PROBE_FUNCTIONS = frozenset({"ProbeStreamFunction", "ProbeQueueFunction"})


def assert_processes_gone(pids: list[int]) -> None:
    left = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        left.append(pid)
    assert not left, f"processes still running after stop: {left}"


def probe_template_data() -> dict[str, Any]:
    """template.yaml with the probe resources added (a copy: the file itself is not touched)."""
    data = copy.deepcopy(Template.load().data)
    data["Resources"].update(load_yaml(PROBE_FRAGMENT)["Resources"])
    return data


def start_stack(template: Template, options: StackOptions, services: LocalServices) -> LocalStack:
    stack = LocalStack(template, options, services=services)
    stack.start()
    assert not stack.report.init_errors, f"functions failed to start: {stack.report.init_errors}"
    return stack


def stop_stack(stack: LocalStack) -> None:
    pids = stack.child_pids()
    stack.stop()
    assert_processes_gone(pids)


@pytest.fixture(scope="session")
def local_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    services = LocalServices(tmp_path_factory.mktemp("local-services"))
    services.start()
    yield services
    pids = services.child_pids()
    services.stop()
    assert_processes_gone(pids)
    assert not live_children(), f"children of the test process still running: {live_children()}"


@pytest.fixture(scope="session")
def local_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    options = StackOptions(api_port=0, data_dir=tmp_path_factory.mktemp("local-stack"))
    stack = start_stack(Template.load(), options, local_services)
    yield stack
    stop_stack(stack)


@pytest.fixture(scope="session")
def probe_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    options = StackOptions(
        api_port=0,
        data_dir=tmp_path_factory.mktemp("probe-stack"),
        seed_file=None,
        only_functions=PROBE_FUNCTIONS,
    )
    stack = start_stack(Template(probe_template_data(), stack_name="probe"), options, local_services)
    yield stack
    stop_stack(stack)
