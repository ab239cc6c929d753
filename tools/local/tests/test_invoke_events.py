"""`make invoke`'s handling of the event file: one line for a file it cannot read, and the orders a sample
event names, written first as the sample events describe them (tools/local/invoke_seeds.py).
The whole path on a running stack, every sample event and no dead letter:
tests/integration/test_invoke_samples.py.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

import tools.local.invoke
from shop.domain.orders import OrderStatus
from tools.local.invoke import invoke
from tools.local.invoke_seeds import named_orders, seeds_for
from tools.template import ROOT, Template

EVENTS = ROOT / "events"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "error: no event file {path}"),
        (b'{"Records": [', "error: {path} is not JSON: Expecting value: line 1 column 14 (char 13)"),
        (b"\xff{}", "error: {path} is not JSON: not UTF-8 (invalid start byte at byte 0)"),
        (b"[" * 100_000 + b"]" * 100_000, "error: {path} is not JSON this reader can take: nested too deep"),
    ],
    ids=["missing", "truncated", "not-utf8", "too-deep"],
)
def test_an_event_file_it_cannot_read_is_one_line_and_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, said: str
) -> None:
    path = tmp_path / "event.json"
    if content is not None:
        path.write_bytes(content)

    code = invoke("OrdersApiFunction", path, tmp_path / "stack.json")

    printed = capsys.readouterr()
    assert code == 2
    assert printed.out == ""
    assert printed.err == said.format(path=path) + "\n"  # one line, no traceback


def test_a_directory_is_not_an_event_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert invoke("OrdersApiFunction", tmp_path, tmp_path / "stack.json") == 2
    assert capsys.readouterr().err == f"error: {tmp_path} is a directory, not an event file\n"


# --- the template: the running stack's, or the one ORDER_STORE and POSTGRES_RELAY choose ---------------
class StackStarted(Exception):
    """Raised by the stand-in for LocalStack: the invocation got as far as starting a stack."""


@pytest.fixture
def stacks_started(monkeypatch: pytest.MonkeyPatch) -> list[Template]:
    """The templates `invoke` starts a stack with (none is started: the stand-in stops it there)."""
    started: list[Template] = []

    def local_stack(template: Template, *args: object, **kwargs: object) -> None:
        started.append(template)
        raise StackStarted

    monkeypatch.setattr(tools.local.invoke, "LocalStack", local_stack)
    return started


@pytest.mark.parametrize(
    ("environment", "function", "said"),
    [
        ({}, "OutboxPublisherFunction", "OutboxPublisherFunction needs ORDER_STORE=postgres"),
        (
            {"POSTGRES_RELAY": "logical"},
            "OrderStoreMaintenanceFunction",
            "OrderStoreMaintenanceFunction needs ORDER_STORE=postgres",
        ),
    ],
)
def test_a_function_the_chosen_parameters_do_not_create_is_refused_naming_what_it_needs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stacks_started: list[Template],
    environment: dict[str, str],
    function: str,
    said: str,
) -> None:
    monkeypatch.delenv("ORDER_STORE", raising=False)
    monkeypatch.delenv("POSTGRES_RELAY", raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)

    code = invoke(function, EVENTS / "scheduler_tick.json", tmp_path / "stack.json")

    error = capsys.readouterr().err
    assert (code, stacks_started) == (2, [])
    assert error.startswith(f"error: {said}"), error
    assert error.count("\n") == 1, error  # one line


def test_without_a_running_stack_the_function_runs_on_the_order_store_the_environment_chooses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stacks_started: list[Template]
) -> None:
    monkeypatch.setenv("ORDER_STORE", "postgres")
    monkeypatch.setenv("POSTGRES_RELAY", "logical")

    for function in ("OrdersApiFunction", "OutboxPublisherFunction"):
        with pytest.raises(StackStarted):
            invoke(function, EVENTS / "scheduler_tick.json", tmp_path / "stack.json")

    assert [
        (t.parameter_values["OrderStore"], t.parameter_values["PostgresRelay"]) for t in stacks_started
    ] == [("postgres", "logical")] * 2


def test_a_running_stack_of_other_parameters_than_the_environment_chooses_is_not_used_silently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as service:  # a running stack's services accept connections
        service.bind(("127.0.0.1", 0))
        service.listen()
        url = f"http://127.0.0.1:{service.getsockname()[1]}"
        state = tmp_path / "stack.json"
        state.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "stack_name": "local",
                    "endpoints": {"dynamodb": url, "moto": url},
                    "parameters": {"OrderStore": "dynamodb", "PostgresRelay": "polling"},
                }
            )
        )
        monkeypatch.setenv("ORDER_STORE", "postgres")

        code = invoke("OrdersApiFunction", EVENTS / "api_get_order.json", state)

    assert code == 2
    assert capsys.readouterr().err == (
        "error: the running local stack has OrderStore=dynamodb PostgresRelay=polling, not "
        "ORDER_STORE=postgres: stop it first, or leave ORDER_STORE=postgres out\n"
    )


def sample(name: str) -> object:
    return json.loads((EVENTS / name).read_text())


def test_the_orders_an_event_names_are_those_of_its_path_and_of_the_events_it_carries() -> None:
    assert named_orders(sample("api_get_order.json")) == ["o-00000000000000000000000000000001"]
    assert named_orders(sample("api_create_order.json")) == []
    assert named_orders(sample("sqs_order_status_inventory_reserved.json")) == [
        "o-0000000000000000000000000000a001"
    ]
    # one order created then cancelled; the records that carry no outbox envelope name nothing
    assert named_orders(sample("relay_mixed_batch.json")) == ["o-00000000000000000000000000000065"]
    # the poison record carries no event: the four around it name their orders
    assert len(named_orders(sample("relay_poison_record.json"))) == 4
    assert named_orders(sample("scheduler_tick.json")) == []


def test_an_order_the_event_describes_is_written_as_its_latest_event_leaves_it() -> None:
    [seed] = seeds_for(sample("relay_mixed_batch.json"), EVENTS / "relay_mixed_batch.json")

    assert seed.order is not None
    # OrderCreated then OrderCancelled: the order as cancelled, so the InventoryReserved the relay's
    # OrderCreated brings is ignored instead of confirming a cancelled order
    assert (seed.order.status, seed.order.version) == (OrderStatus.CANCELLED, 2)
    assert seed.source == "from the order events of relay_mixed_batch.json"


def test_an_order_the_event_only_names_is_written_as_the_sample_events_create_it() -> None:
    [seed] = seeds_for(
        sample("sqs_order_status_inventory_reserved.json"),
        EVENTS / "sqs_order_status_inventory_reserved.json",
    )

    assert seed.order is not None
    assert (seed.order.order_id, seed.order.status, seed.order.version) == (
        "o-0000000000000000000000000000a001",
        OrderStatus.PENDING,
        1,
    )
    assert [(line.sku, line.quantity) for line in seed.order.lines] == [
        ("SKU-RED-MUG", 2),
        ("SKU-BLUE-PEN", 1),
    ]
    assert seed.source == "from the OrderCreated of sqs_inventory_duplicate.json"  # the first file by name


def test_an_order_nothing_describes_is_not_invented(tmp_path: Path) -> None:
    event = sample("api_get_order.json")
    path = tmp_path / "api_get_order.json"  # no other sample beside it
    path.write_text(json.dumps(event))

    [seed] = seeds_for(event, path)

    assert (seed.order_id, seed.order) == ("o-00000000000000000000000000000001", None)
    assert seed.source == "no sample event describes it"
