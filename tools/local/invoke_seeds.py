"""What an event for `make invoke` refers to, written before it runs: the orders it names.

A sample event names orders (the API's path, the subject of the events an SQS message or a stream record
carries). On a stack where they do not exist, what the function writes goes on through the saga and
fails there: an OrderCreated that a relay sample puts on the bus has the inventory reserve stock, and its
InventoryReserved then fails in the order-status consumer five times into its DLQ. So each order the event
names is written first, unless one with its id exists, as the events themselves describe it:
- the latest order representation (an order event's `data`, the API's body) the event carries for it;
- else the one the sample events beside the file create it with (their OrderCreated: PENDING), for events
  that name an order without describing it (a GET, an inventory answer).
An order nothing describes is not invented: it is named, and the function meets it missing, as it would.
Seeded orders are written as they stand, with no event (OrderRepository.seed: the repositories own the
keys and the SQL), on the stack's order store.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from unittest import mock

from shop.adapters import aws
from shop.adapters.dynamodb.outbox_items import ENVELOPE
from shop.domain import inventory, orders
from shop.domain.orders import ORDER_CREATED, Order, OrderLine, OrderStatus
from shop.runtime.config import Settings
from tools.local.runtime.functions import forced_environment
from tools.local.services.emulators import Endpoints
from tools.template import Template

# The function whose environment names the order store (its table, its database): the API writes orders.
ORDER_STORE_FUNCTION = "OrdersApiFunction"
_ORDER_SOURCES = frozenset({orders.EVENT_SOURCE, inventory.EVENT_SOURCE})  # their subject is the order id


class SeedableOrders(Protocol):
    def get(self, order_id: str) -> Order | None: ...
    def seed(self, order: Order) -> bool: ...


@dataclass(frozen=True)
class Seed:
    """An order the event names, and what became of it."""

    order_id: str
    order: Order | None  # None: nothing describes it
    source: str  # where its description comes from (or why there is none)
    written: bool = False


def carried_events(event: Any) -> list[dict[str, Any]]:
    """The CloudEvents an invocation event carries: SQS messages' EventBridge `detail`, stream records'
    outbox envelopes. Records that carry none (a poison record, a malformed message) are skipped."""
    records = event.get("Records") if isinstance(event, dict) else None
    found: list[dict[str, Any]] = []
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict):
            continue
        with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
            if "body" in record:
                detail = json.loads(record["body"])["detail"]
            else:
                detail = json.loads(record["dynamodb"]["NewImage"][ENVELOPE]["S"])
            if isinstance(detail, dict):
                found.append(detail)
    return found


def named_orders(event: Any) -> list[str]:
    """The order ids an invocation event names, in order: the API path's `orderId`, the subject of each
    order or inventory event it carries."""
    names: list[str] = []
    parameters = event.get("pathParameters") if isinstance(event, dict) else None
    if isinstance(parameters, dict) and isinstance(parameters.get("orderId"), str):
        names.append(parameters["orderId"])
    for carried in carried_events(event):
        if carried.get("source") in _ORDER_SOURCES and isinstance(carried.get("subject"), str):
            names.append(carried["subject"])
    return list(dict.fromkeys(names))


def order_from_data(data: Any) -> Order | None:
    """The order an order event's `data` (the order representation) describes; None if it is not one."""
    try:
        return Order(
            order_id=str(data["orderId"]),
            customer_id=str(data["customerId"]),
            currency=str(data["currency"]),
            lines=tuple(
                OrderLine(str(item["sku"]), int(item["quantity"]), int(item["unitPrice"]))
                for item in data["items"]
            ),
            status=OrderStatus(data["status"]),
            version=int(data["version"]),
            created_at=str(data["createdAt"]),
            updated_at=str(data["updatedAt"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def described_orders(event: Any) -> dict[str, Order]:
    """Each order the event's order events describe, as the latest of them (highest sequence) leaves it."""
    latest: dict[str, tuple[int, Order]] = {}
    for carried in carried_events(event):
        if carried.get("source") != orders.EVENT_SOURCE:
            continue
        order = order_from_data(carried.get("data"))
        sequence = carried.get("sequence")
        if order is None or not isinstance(sequence, int):
            continue
        if order.order_id not in latest or sequence > latest[order.order_id][0]:
            latest[order.order_id] = (sequence, order)
    return {order_id: order for order_id, (_, order) in latest.items()}


def created_in_samples(directory: Path) -> dict[str, tuple[Order, str]]:
    """Each order an OrderCreated of the JSON files in `directory` creates, with the file's name."""
    created: dict[str, tuple[Order, str]] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            sample = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for carried in carried_events(sample):
            order = order_from_data(carried.get("data")) if carried.get("type") == ORDER_CREATED else None
            if order is not None:
                created.setdefault(order.order_id, (order, path.name))
    return created


def seeds_for(event: Any, event_path: Path) -> list[Seed]:
    """The orders `event` (read from `event_path`) names, each with what describes it."""
    names = named_orders(event)
    if not names:
        return []
    described = described_orders(event)
    samples = created_in_samples(event_path.parent) if set(names) - set(described) else {}
    seeds = []
    for order_id in names:
        if order_id in described:
            seeds.append(Seed(order_id, described[order_id], f"from the order events of {event_path.name}"))
        elif order_id in samples:
            order, sample = samples[order_id]
            seeds.append(Seed(order_id, order, f"from the OrderCreated of {sample}"))
        else:
            seeds.append(Seed(order_id, None, "no sample event describes it"))
    return seeds


@contextlib.contextmanager
def order_store(template: Template, endpoints: Endpoints) -> Iterator[SeedableOrders]:
    """The stack's order store, as the order API's environment names it, reached from this process."""
    spec = template.function(ORDER_STORE_FUNCTION)
    settings = Settings.from_env({**spec.environment, **forced_environment(endpoints)})
    # The adapters' clients read the endpoints and credentials from the environment, as in a function.
    with mock.patch.dict("os.environ", forced_environment(endpoints)):
        # Clients made before the endpoints were set would ask AWS itself (the order database's password
        # too: its secrets provider is made on the adapters' Secrets Manager client).
        aws.reset_clients()
        try:
            if settings.order_store == "postgres":
                from shop.adapters.postgres.connection import Database
                from shop.adapters.postgres.order_repository import PostgresOrderRepository
                from shop.runtime.wiring.order_database import connection_settings

                database = Database(connection_settings(settings))
                try:
                    yield PostgresOrderRepository(database, settings)
                finally:
                    database.close()
            else:
                from shop.adapters.dynamodb.order_repository import DynamoOrderRepository

                yield DynamoOrderRepository(settings)
        finally:
            aws.reset_clients()


def seed_named_orders(
    event: Any, event_path: Path, template: Template, endpoints: Endpoints, say: Callable[[str], None]
) -> list[Seed]:
    """Write each order `event` names that the stack lacks, saying what was written, and naming an order
    that is missing and that nothing describes."""
    seeds = seeds_for(event, event_path)
    if not seeds:
        return seeds
    done = []
    with order_store(template, endpoints) as store:
        for seed in seeds:
            if seed.order is not None:
                done.append(Seed(seed.order_id, seed.order, seed.source, store.seed(seed.order)))
                continue
            if store.get(seed.order_id) is None:
                say(
                    f"note: order {seed.order_id} does not exist here and is not written first: {seed.source}"
                )
            done.append(seed)
    for line in _written_lines([seed for seed in done if seed.written]):
        say(line)
    return done


def _written_lines(written: list[Seed]) -> list[str]:
    """One line per status and description (a relay sample names 25 orders)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for seed in written:
        assert seed.order is not None
        groups.setdefault((str(seed.order.status), seed.source), []).append(seed.order_id)
    lines = []
    for (status, source), ids in groups.items():
        shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
        noun = "the order" if len(ids) == 1 else f"the {len(ids)} orders"
        lines.append(f"wrote first {noun} the event names ({status}, {source}): {shown}")
    return lines
