"""The local stack for the layers that run it (tests/integration, tests/conformance): the session
fixtures' bodies (tests/conftest.py holds the fixtures, so both layers share one of each per session)
and the helpers their tests start and stop stacks of their own with, and place orders through a stack's API.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

from tools.local.processes import live_children
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import Template, load_yaml

PROBE_FRAGMENT = Path(__file__).with_name("integration") / "probe" / "fragment.yaml"
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


def created_order(
    stack: LocalStack, customer: str, items: list[dict[str, Any]], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """POST /orders on the stack's API, in USD, under a fresh Idempotency-Key (with any other headers
    given): the order it answered 201 Created with."""
    response = requests.post(
        f"{stack.api_url}/orders",
        json={"customerId": customer, "currency": "USD", "items": items},
        headers={"Idempotency-Key": str(uuid.uuid4()), **(headers or {})},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    order: dict[str, Any] = response.json()
    return order


def start_stack(template: Template, options: StackOptions, services: LocalServices) -> LocalStack:
    stack = LocalStack(template, options, services=services)
    stack.start()
    assert not stack.report.init_errors, f"functions failed to start: {stack.report.init_errors}"
    return stack


def stop_stack(stack: LocalStack) -> None:
    pids = stack.child_pids()
    stack.stop()
    assert_processes_gone(pids)


def services_session(data_dir: Path) -> Iterator[LocalServices]:
    """`local_services`: DynamoDB Local and moto server, stopped with every process checked gone."""
    services = LocalServices(data_dir)
    services.start()
    yield services
    pids = services.child_pids()
    services.stop()
    assert_processes_gone(pids)
    assert not live_children(), f"children of the test process still running: {live_children()}"


def stack_session(services: LocalServices, data_dir: Path) -> Iterator[LocalStack]:
    """`local_stack`: template.yaml exactly as `make local` runs it (seeded, API on a free port)."""
    stack = start_stack(Template.load(), StackOptions(api_port=0, data_dir=data_dir), services)
    yield stack
    stop_stack(stack)


def postgres_stack_session(services: LocalServices, data_dir: Path) -> Iterator[LocalStack]:
    """`postgres_stack`: template.yaml with OrderStore=postgres, as `make local ORDER_STORE=postgres` runs
    it (orders on the services' embedded PostgreSQL, the scheduled outbox publisher)."""
    template = Template.load(parameters={"OrderStore": "postgres"}, stack_name="pg")
    stack = start_stack(template, StackOptions(api_port=0, data_dir=data_dir), services)
    yield stack
    stop_stack(stack)


def logical_stack_session(services: LocalServices, data_dir: Path) -> Iterator[LocalStack]:
    """`logical_stack`: OrderStore=postgres with PostgresRelay=logical, as `make local ORDER_STORE=postgres
    POSTGRES_RELAY=logical` runs it (the publisher reads the outbox's inserts from a replication slot)."""
    template = Template.load(
        parameters={"OrderStore": "postgres", "PostgresRelay": "logical"}, stack_name="pgl"
    )
    stack = start_stack(template, StackOptions(api_port=0, data_dir=data_dir), services)
    yield stack
    stop_stack(stack)


def probe_stack_session(services: LocalServices, data_dir: Path) -> Iterator[LocalStack]:
    """`probe_stack`: template.yaml plus the probe resources, only the probe functions started."""
    options = StackOptions(api_port=0, data_dir=data_dir, seed_file=None, only_functions=PROBE_FUNCTIONS)
    stack = start_stack(Template(probe_template_data(), stack_name="probe"), options, services)
    yield stack
    stop_stack(stack)
