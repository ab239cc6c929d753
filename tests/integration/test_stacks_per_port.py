"""Stacks per port on running stacks: two stacks' states side by side (as `make local PORT=...` writes them),
and `make invoke` and `python -m operations --local` each act on the stack of the port they are pointed
at, never the other. Before, both ports shared `.local-data/stack.json`: stopping one stack removed the
other's, and `make invoke` then started a throwaway stack while the first still ran.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import shop.adapters.aws
import tools.local.__main__ as local_main
from operations import admin
from operations import local_stack as operations_local
from shop.adapters.dynamodb import keys
from tests.support import load_event
from tools.local import stack_state
from tools.local.stack import LocalStack
from tools.local.stack_state import state_file, write_state

PORTS = (3101, 3102)


@pytest.fixture
def stacks(
    local_stack: LocalStack, probe_stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[int, LocalStack]]:
    """Two running stacks (other stack names, other tables), each with the state of its own port."""
    monkeypatch.setattr(stack_state, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(operations_local, "STATE_ROOT", tmp_path)
    pointed = dict(zip(PORTS, (local_stack, probe_stack), strict=True))
    for port, stack in pointed.items():
        write_state(stack, state_file(port))
        for name in json.loads(state_file(port).read_text())["operator_environment"]:
            monkeypatch.setenv(name, os.environ.get(name, ""))  # so the commands' changes are undone
    shop.adapters.aws.reset_clients()
    yield pointed
    shop.adapters.aws.reset_clients()


def item(stack: LocalStack, table: str, key: dict[str, dict[str, str]]) -> bool:
    found = stack.clients.dynamodb().get_item(TableName=stack.template.physical_name(table), Key=key)
    return "Item" in found


def test_make_invoke_acts_on_the_stack_of_port(
    stacks: dict[int, LocalStack],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    created: dict[int, str] = {}
    for port in stacks:
        event = load_event("api_create_order.json")
        event["headers"]["Idempotency-Key"] = str(uuid.uuid4())
        event_file = tmp_path / f"create-{port}.json"
        event_file.write_text(json.dumps(event))
        monkeypatch.setenv("PORT", str(port))

        assert local_main._invoke("OrdersApiFunction", event_file) == 0

        printed = capsys.readouterr()
        assert "against the running local stack" in printed.err
        created[port] = json.loads(json.loads(printed.out)["body"])["orderId"]

    for port, stack in stacks.items():
        assert {p: item(stack, "OrdersTable", keys.order_key(o)) for p, o in created.items()} == {
            p: p == port for p in stacks
        }, f"the stack of port {port} holds its own order only"


def test_the_operator_commands_act_on_the_stack_of_port(
    stacks: dict[int, LocalStack], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skus = {port: f"SKU-PORT-{port}-{uuid.uuid4().hex[:8]}" for port in stacks}
    for port, sku in skus.items():
        seed = tmp_path / f"seed-{port}.json"
        seed.write_text(json.dumps({"stock": [{"sku": sku, "available": 7}]}))
        monkeypatch.setenv("PORT", str(port))
        shop.adapters.aws.reset_clients()

        assert admin.main(["--local", "seed", "--file", str(seed)]) == 0

    for port, stack in stacks.items():
        assert {p: item(stack, "InventoryTable", keys.stock_key(s)) for p, s in skus.items()} == {
            p: p == port for p in stacks
        }, f"the stack of port {port} holds its own stock only"
