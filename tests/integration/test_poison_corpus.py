"""The poison corpus (tests/support/outbox_corpus.py) written to running stacks, on both order stores: every
record is parked, every order placed after it is CONFIRMED, the console shows each parked record, the
inspector answers, and no thread of the stack stopped.

The reproduced bug: an outbox item whose envelope held a 5,000-digit integer was parked by the relay, but
the console's renderer raised on it in the stream poller's thread; the poller died, the table's stream
was never read again, and orders placed afterwards stayed PENDING while the API kept answering.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from tests.integration.watched_stacks import WatchedStack, place_order, statuses, watched_stack
from tests.support.outbox_corpus import INSERT_OUTBOX_ROW, LONG_INTEGER, PoisonRecord, corpus, raw_surrogate
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack
from tools.template import Template

ORDERS_AFTER = 10
SETTLE_SECONDS = 60.0


# The three stacks: the DynamoDB stream relay, and PostgreSQL's outbox with each of its relays.
STACKS = {
    "dynamodb": ("poisondy", {"OrderStore": "dynamodb"}),
    "postgres": ("poisonpg", {"OrderStore": "postgres"}),
    "postgres-logical": ("poisonpgl", {"OrderStore": "postgres", "PostgresRelay": "logical"}),
}


@pytest.fixture(scope="module", params=list(STACKS))
def watched(
    request: pytest.FixtureRequest, local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WatchedStack]:
    stack_name, parameters = STACKS[request.param]
    template = Template.load(parameters=parameters, stack_name=stack_name)
    with watched_stack(local_services, tmp_path_factory.mktemp(stack_name), template) as watched:
        yield watched


def write(stack: LocalStack, records: list[PoisonRecord]) -> list[PoisonRecord]:
    """Write each record its store can hold to the orders' outbox; the records written."""
    written = []
    if stack.template.parameter_values["OrderStore"] == "postgres":
        with stack.order_database.connect() as connection:
            for record in records:
                if record.postgres is not None:
                    connection.execute(INSERT_OUTBOX_ROW, record.postgres_row())
                    written.append(record)
        return written
    table = stack.template.physical_name("OrdersTable")
    for record in records:
        stack.clients.dynamodb().put_item(TableName=table, Item=record.dynamodb_item())
        written.append(record)
    return written


def parked_event_ids(stack: LocalStack) -> set[str]:
    """The event ids in the relay poison queue: every message received (hidden meanwhile, as a receive of
    ten at a time with no visibility timeout would return the same ten), then made visible again."""
    sqs, url = stack.clients.sqs(), stack.queue_url("RelayPoisonQueue")
    found: dict[str, str] = {}  # receipt handle -> event id
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30).get(
        "Messages", []
    ):
        found.update({m["ReceiptHandle"]: str(json.loads(m["Body"])["eventId"]) for m in messages})
    for handle in found:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    return set(found.values())


@dataclass
class Written:
    """The corpus written to a watched stack: an order placed before it (poison in its own outbox too),
    the records written, the orders placed after them."""

    watched: WatchedStack
    victim: str
    poison: list[PoisonRecord]
    after: list[str]


@pytest.fixture(scope="module")
def written(watched: WatchedStack) -> Written:
    stack = watched.stack
    victim = place_order(stack)
    stack.wait_for(
        lambda: statuses(stack, [victim])[victim] == "CONFIRMED", SETTLE_SECONDS, "the first order"
    )
    records = corpus()
    poison = write(stack, records + [record.of_order(victim, index) for index, record in enumerate(records)])
    assert LONG_INTEGER in {record.name for record in poison}
    return Written(watched, victim, poison, [place_order(stack) for _ in range(ORDERS_AFTER)])


def every_poison_record_parked(written: Written) -> LocalStack:
    """Wait until the relay parked every record of the corpus; the stack."""
    stack = written.watched.stack
    expected = {record.event_id for record in written.poison}
    stack.wait_for(lambda: expected <= parked_event_ids(stack), SETTLE_SECONDS, "every poison record parked")
    return stack


def test_the_corpus_is_parked_and_every_order_after_it_is_confirmed_with_nothing_stopped(
    written: Written,
) -> None:
    stack = every_poison_record_parked(written)
    stack.wait_for(
        lambda: set(statuses(stack, written.after).values()) == {"CONFIRMED"},
        SETTLE_SECONDS,
        "every order placed after the corpus confirmed",
    )

    printed = written.watched.printed()
    for record in written.poison:
        assert re.search(rf"parked in the relay poison queue: .*\(event {record.event_id}\)", printed), (
            f"no console line for {record.name}"
        )
    health = requests.get(f"{stack.inspector_url}api/health", timeout=10).json()["threads"]
    assert {thread["name"] for thread in health} >= {"console", "stream-OutboxRelayFunction.OrdersOutbox"}
    assert [thread for thread in health if not thread["alive"] or thread["restarts"] or thread["error"]] == []
    assert "thread " not in printed, "no thread failure was reported"
    assert "listener " not in printed, "no listener failed"


def test_the_inspector_answers_every_page_the_corpus_touches(
    written: Written,
) -> None:
    stack = every_poison_record_parked(written)

    # The orders, the poison queue's messages, the hops of an order with poison in its outbox.
    for page in ("orders", "queues", f"orders/{written.victim}"):
        response = requests.get(f"{stack.inspector_url}api/{page}", timeout=30)
        assert response.status_code == 200, f"{page}: {response.text[:500]}"


# --- a lone surrogate stored raw: a record UTF-8 cannot encode ----------------------------------------------
RAW_SURROGATE_SECONDS = 20.0


@pytest.fixture(scope="module")
def raw_surrogate_written(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WatchedStack, PoisonRecord]]:
    """A stack of its own: a record that failed its batch would hold its shard until MaximumRetryAttempts."""
    template = Template.load(stack_name="poisonraw")
    with watched_stack(local_services, tmp_path_factory.mktemp("poison-raw"), template) as watched:
        record = raw_surrogate()
        write(watched.stack, [record])
        yield watched, record


def test_a_lone_surrogate_stored_raw_is_parked_too(
    raw_surrogate_written: tuple[WatchedStack, PoisonRecord],
) -> None:
    watched, record = raw_surrogate_written

    watched.stack.wait_for(
        lambda: record.event_id in parked_event_ids(watched.stack), RAW_SURROGATE_SECONDS, "the record parked"
    )

    health = requests.get(f"{watched.stack.inspector_url}api/health", timeout=10).json()["threads"]
    assert [thread for thread in health if not thread["alive"] or thread["restarts"] or thread["error"]] == []
