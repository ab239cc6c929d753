"""`make invoke` with every sample event of events/ against a running stack: what each function writes goes
through the saga to its end, and nothing the user did not ask for happens. No consumer fails a message (a
failed message is retried, and after ConsumerMaxReceiveCount receives dead-lettered: six minutes later),
every dead-letter queue stays empty, and stock moves only for the reservations of orders that exist.

Before invoke wrote the orders a sample names (tools/local/invoke_seeds.py), the relay samples' OrderCreated
reserved stock for orders nobody had placed, and the order-status consumer failed their InventoryReserved
into its DLQ.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shop.adapters.dynamodb import keys
from tests.local_stacks import start_stack, stop_stack
from tests.support import EVENTS_DIR, SAMPLE_EVENTS
from tools.local.invoke import invoke
from tools.local.invoke_seeds import named_orders
from tools.local.services.emulators import LocalServices
from tools.local.services.provisioning import SEED_FILE
from tools.local.stack import LocalStack, StackOptions
from tools.local.stack_state import write_state
from tools.template import Template

QUIET_SECONDS = 3.0  # no hop for this long: a stream poll is 0.25 s, a queue's long poll 1 s
SETTLE_SECONDS = 90.0


@pytest.fixture(scope="module")
def samples_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """A running stack of its own (`make local` as it starts, seeded), so the samples' fixed order ids and
    the stock they move are this test's alone."""
    data_dir = tmp_path_factory.mktemp("samples-stack")
    stack = start_stack(
        Template.load(stack_name="samples"), StackOptions(api_port=0, data_dir=data_dir), local_services
    )
    yield stack
    stop_stack(stack)


def queue_depth(stack: LocalStack, queue: str) -> int:
    attributes = stack.clients.sqs().get_queue_attributes(
        QueueUrl=stack.queue_url(queue),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(value) for value in attributes.values())


def queues(stack: LocalStack) -> tuple[list[str], list[str]]:
    """(the consumer queues, the dead-letter queues: their redrive targets and the relay's DLQ)."""
    template = stack.template
    consumers, dead = [], ["RelayDeadLetterQueue"]
    for queue in template.of_type("AWS::SQS::Queue"):
        policy = template.properties(queue).get("RedrivePolicy")
        if policy:
            consumers.append(queue)
            dead.append(str(template.logical_id_for_arn(policy["deadLetterTargetArn"])))
    return consumers, dead


def failed_messages(stack: LocalStack) -> list[tuple[str, tuple[str, ...]]]:
    """The messages and records the stack's consumers failed (each to be retried, then dead-lettered)."""
    return [(i.function, i.failed_ids) for i in stack.activity.invocations() if i.failed_ids]


def outcome(stack: LocalStack, consumer_queues: list[str]) -> str | None:
    """ "failed" as soon as a consumer fails a message; "settled" once every consumer queue is empty, none
    in flight either, and no hop for QUIET_SECONDS; None meanwhile."""
    if failed_messages(stack):
        return "failed"
    entries = stack.activity.entries()
    if entries and time.time() - max(entry.at for entry in entries) < QUIET_SECONDS:
        return None
    return "settled" if all(queue_depth(stack, queue) == 0 for queue in consumer_queues) else None


def items(stack: LocalStack, table: str, entity: str) -> list[dict[str, Any]]:
    dynamodb = stack.clients.dynamodb()
    pages = dynamodb.get_paginator("scan").paginate(TableName=stack.template.physical_name(table))
    return [item for page in pages for item in page["Items"] if item.get("entityType", {}).get("S") == entity]


def test_make_invoke_with_every_sample_event_dead_letters_nothing_and_moves_stock_only_for_real_orders(
    samples_stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stack = samples_stack
    state_file = tmp_path / "stack.json"
    write_state(stack, state_file)
    samples = [(f, name) for f, names in SAMPLE_EVENTS.items() if f in stack.functions for name in names]
    assert len(samples) >= 15  # the dynamodb store's functions: every sample but the PostgreSQL ones

    errors = {}
    for function, name in samples:
        code = invoke(function, EVENTS_DIR / name, state_file)
        printed = capsys.readouterr().out  # the response, or the error document
        if code != 0:
            errors[name] = printed

    assert errors == {}, "each sample event runs without a function error"
    consumer_queues, dead_letter_queues = queues(stack)
    stack.wait_for(lambda: outcome(stack, consumer_queues), SETTLE_SECONDS, "the saga to settle")
    assert failed_messages(stack) == [], "a consumer failed messages: they would be dead-lettered"
    assert {queue: queue_depth(stack, queue) for queue in dead_letter_queues} == dict.fromkeys(
        dead_letter_queues, 0
    )
    # Every order a sample names exists, and stock moved only for reservations of orders that exist.
    dynamodb, orders_table = stack.clients.dynamodb(), stack.template.physical_name("OrdersTable")

    def exists(order_id: str) -> bool:
        return "Item" in dynamodb.get_item(TableName=orders_table, Key=keys.order_key(order_id))

    named = {
        order_id
        for _, name in samples
        for order_id in named_orders(json.loads((EVENTS_DIR / name).read_text()))
    }
    reservations = items(stack, "InventoryTable", "Reservation")
    assert [order_id for order_id in sorted(named) if not exists(order_id)] == []
    assert [r["orderId"]["S"] for r in reservations if not exists(r["orderId"]["S"])] == []
    held: Counter[str] = Counter()
    for reservation in reservations:
        if reservation["status"]["S"] == "RESERVED":
            for line in reservation["lines"]["L"]:
                held[line["M"]["sku"]["S"]] += int(line["M"]["quantity"]["N"])
    seeded = {entry["sku"]: entry["available"] for entry in json.loads(SEED_FILE.read_text())["stock"]}
    available = {
        item["sku"]["S"]: int(item["available"]["N"]) for item in items(stack, "InventoryTable", "Stock")
    }
    assert {sku: seeded[sku] - available[sku] for sku in seeded} == {sku: held[sku] for sku in seeded}
