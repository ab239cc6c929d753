"""`make invoke`'s handling of the event file: one line for a file it cannot read, and the orders a sample
event names, written first as the sample events describe them (tools/local/invoke_seeds.py).
The whole path on a running stack, every sample event and no dead letter:
tests/integration/test_invoke_samples.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shop.domain.orders import OrderStatus
from tools.local.invoke import invoke
from tools.local.invoke_seeds import named_orders, seeds_for
from tools.template import ROOT

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
