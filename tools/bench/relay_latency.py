"""Relays at AWS latency (`make bench`, part `relay_latency`, issue 35): each relay's own code on its real
source, publishing to a bus that answers every PutEvents after a set latency (tools/bench/latency_bus.py).

On moto a PutEvents call costs about a millisecond; on AWS tens. Elsewhere the bench times the relays
against moto, so what a relay invocation can move at AWS's latency was not measured. Here, for each
latency in LATENCIES_MS:
- stream relay: orders written through the product's DynamoDB order repository (OrderService) on
  DynamoDB Local, the orders table's stream read with GetRecords from its shards, kept by the template's
  FilterCriteria and delivered as Lambda delivers them, in batches of the template's RelayBatchSize, to
  the relay function's handler (functions/outbox_relay/app.py), one batch after another as one shard's
  invocations are (ParallelizationFactor 1, the default): tools/bench/relay_latency_stream.py. The same
  records are delivered at each latency. events/s = events published / the handler's wall time summed;
- polling publisher and logical relay: on the embedded PostgreSQL (wal_level=logical), a database per
  relay, migrated and switched to the relay by the migration step's own code (the logical relay's slot
  created there, as in tools/bench/postgres_relays.py); for each latency, POSTGRES_ORDERS orders written
  through the product's PostgreSQL order repository, then the deployed publisher's round
  (functions/outbox_publisher/app.py's publish_round: the configured relay's publish_pending_round or
  relay_slot_round on the function's connection, its publish logs) run until a round takes nothing and
  reports no backlog, as the function's loop would before its idle pause. events/s = events published /
  the rounds' wall time.
Every relay publishes with the publisher the product wires (shop.runtime.wiring.relay.event_publisher)
through the transport its function's template environment names (PUBLISH_TRANSPORT: the PostgreSQL
publisher's is the AWS Common Runtime's, the stream relay's the SDK's boto3 client): however it is
configured (PutEvents calls in flight at once, transport), the product decides, not the bench. Each relay
is timed warm: its EventBridge client exists before the first call, as in every invocation after an
execution environment's first (whose init the cold start part measures).
The functions log at the template's default LogLevel (INFO: a line per ten events published), their
output discarded.

Orders are written by WRITERS threads at once, interleaved as a live shard or outbox holds them: about
ORDERS_BETWEEN orders are created between an order's create and its confirmation, and again before its
cancel when it is one in CANCEL_EVERY, so a batch holds several events of some orders (2.2 events per
order in all).

The bus runs in a process of its own (tools/bench/latency_bus.py), as EventBridge is not inside the
function on AWS: its work is not charged to the relay's time nor to its CPU.

Per relay and latency: `putevents_ms`, `events_per_s`, `calls_per_event` (calls the bus received per
event), `out_of_order` (events whose per-order sequence is lower than one the bus already received for
that order), and beside them `events`, `calls`, `seconds`, `relay_cpu_ms_per_event` (the CPU time of
the bench's process, every thread of it, the product's publishing threads included, over the same span as
`seconds`, per event: time.process_time, so neither the bus's process nor DynamoDB Local's nor
PostgreSQL's), `lambda_memory_mb` (the function's MemorySize in the template), `lambda_vcpus` (what Lambda
allots it: "at 1,769 MB, a function has the equivalent of one vCPU", the Lambda guide's "Configure Lambda
function memory"), `events_per_s_on_lambda` (events/s as the deployed function can move them: the measured
rate, or the rate its vCPU share allows at the measured CPU per event when that is lower; the bench's
process has a whole core, a 512 MB function 0.29 of one; the target reads this figure), `in_flight_twice`
(an order's event sent while another call with one of its events was
unanswered), `peak_calls_in_flight`, `write_seconds` (the orders' writing, not timed as the relay's) and
invocations (stream) or rounds (PostgreSQL). Every event written must reach the bus, once at least.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import psycopg

from shop.adapters import aws
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.adapters.postgres.connection import Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.adapters.postgres.outbox import OutboxRow
from shop.adapters.postgres.relay_mode import switch_relay
from shop.adapters.postgres.replication import slot_name
from shop.adapters.postgres.schema import apply_migrations
from shop.domain.orders import OrderService
from shop.runtime import config, invocation
from shop.runtime.observability import logger
from shop.runtime.outbox_publishing import PublishOutcome
from shop.runtime.wiring import order_database
from tools.bench.function_modules import load_function
from tools.bench.latency_bus import LatencyBus
from tools.bench.postgres_relays import _confirm, _place
from tools.bench.relay_latency_stream import StreamRelay, quiet
from tools.local.runtime.context import LambdaContext
from tools.local.services.order_database import EmbeddedPostgres
from tools.template import Template

LATENCIES_MS = (20, 50, 100)
RELAYS = ("stream", "polling", "logical")
# The targets (issue 35), checked by tools/bench/__main__.py and drawn by tools/bench/charts.py: at 50 ms a
# PutEvents, events/s of one relay invocation (a stream shard's partition writes about 110 outbox items a
# second: 400 is over 3x that), and at every latency no event out of its order's sequence and at most
# 0.10 PutEvents calls per event.
TARGET_LATENCY_MS = 50
TARGET_EVENTS_PER_S = {"stream": 400, "polling": 3000, "logical": 3000}
TARGET_CALLS_PER_EVENT = 0.10
# A drain may end on one short call: its last round holds what is left of the backlog, which can be an
# order's two events that no call may carry together (1 in 18 of simulated drains of the PostgreSQL
# relays' 2,000 orders, after the other rounds ended on whole calls: docs/performance.md).
SHORT_CALLS_PER_DRAIN = 1
LAMBDA_MB_PER_VCPU = 1769  # the Lambda developer guide, "Configure Lambda function memory"
# 2,000 orders are 4,400 events waiting (created, confirmed, one in five cancelled): at the 3,000 events/s
# targeted at 50 ms a drain lasts about 1.5 s, long enough that a round's fixed costs and the last short
# round weigh little, and short enough that writing them (7-16 s per relay and latency on a busy 2-core
# machine) keeps the part within minutes.
POSTGRES_ORDERS = 2_000
# 1,000 orders are 2,200 stream records that pass the filter, 22 invocations of 100: a shard's backlog of
# about 20 s at what a partition can write (about 110 outbox items a second), enough invocations that the
# first one's connection set-up weighs little.
STREAM_ORDERS = 1_000
# Orders created, by all writers together, between an order's create and its confirmation (and again its
# cancel): the shape of the relay part's stream (tools/bench/relay_efficiency.py: an order every 20 ms, its
# next event about 0.3 s later), so that a batch of 100 holds both events of some orders.
ORDERS_BETWEEN = 16
CANCEL_EVERY = 5
STACK_NAME = "bench-latency"  # its own table names, apart from the relay part's write cost run
DRAIN_TIMEOUT_SECONDS = 600.0
PUBLISHER_FUNCTION = "OutboxPublisherFunction"
# The function whose MemorySize (its vCPU share on Lambda) each relay runs under.
RELAY_FUNCTIONS = {
    "stream": "OutboxRelayFunction",
    "polling": PUBLISHER_FUNCTION,
    "logical": PUBLISHER_FUNCTION,
}
WRITERS = 4  # threads writing orders at once (1.4-1.8x faster than one on 2 cores), ORDERS_BETWEEN / 4 each


def write_interleaved(service: OrderService, orders: int, interleave: int, prefix: str) -> int:
    """One writer's orders created, confirmed and some cancelled: order n created, then order n - interleave
    confirmed, then order n - 2 * interleave cancelled when it is one in CANCEL_EVERY. Returns the number of
    events written."""
    placed: list[str] = []
    events = 0
    for step in range(orders + 2 * interleave):
        if step < orders:
            placed += _place(service, 1, f"{prefix}-{step}")
            events += 1
        if 0 <= (confirmed := step - interleave) < orders:
            _confirm(service, [placed[confirmed]])
            events += 1
        if 0 <= (cancelled := step - 2 * interleave) < orders and cancelled % CANCEL_EVERY == 0:
            service.cancel_order(placed[cancelled], correlation_id=f"{prefix}-{cancelled}")
            events += 1
    return events


def write_orders(services: Sequence[OrderService], orders: int, prefix: str) -> tuple[int, float]:
    """`orders` shared among writers, a thread and a service each (as many API and consumer invocations
    write at once), ORDERS_BETWEEN shared among them too; returns (events written, seconds)."""
    shares = [orders // len(services) + (index < orders % len(services)) for index in range(len(services))]
    interleave = max(1, ORDERS_BETWEEN // len(services))
    began = time.perf_counter()
    with ThreadPoolExecutor(len(services)) as pool:
        written = pool.map(
            lambda index: write_interleaved(services[index], shares[index], interleave, f"{prefix}-{index}"),
            range(len(services)),
        )
        events = sum(written)
    return events, time.perf_counter() - began


class Received(Protocol):
    """What the bus received, counted: the LatencyBus (or, in the tests, a Recorder of its own)."""

    def figures(self) -> dict[str, Any]: ...


def figures(
    bus: Received,
    latency_ms: int,
    expected: int,
    seconds: float,
    cpu_seconds: float,
    memory_mb: int = LAMBDA_MB_PER_VCPU,
    **extra: Any,
) -> dict[str, Any]:
    """One relay at one latency, from what the bus received (every event written must be there), timed over
    `seconds` of wall time and `cpu_seconds` of the bench process's CPU, for a function of `memory_mb`."""
    received = bus.figures()
    if received["distinct_events"] != expected:
        raise AssertionError(
            f"the bus received {received['distinct_events']} of the {expected} events written"
        )
    events = received["entries"]
    vcpus = memory_mb / LAMBDA_MB_PER_VCPU
    return {
        "putevents_ms": latency_ms,
        "events_per_s": events / seconds,
        # no CPU counted (a clock too coarse for a tiny run): the share cannot bind
        "events_per_s_on_lambda": min(events / seconds, vcpus * events / cpu_seconds)
        if cpu_seconds
        else events / seconds,
        "lambda_memory_mb": memory_mb,
        "lambda_vcpus": vcpus,
        "calls_per_event": received["calls"] / events,
        "out_of_order": received["out_of_order"],
        "events": events,
        "calls": received["calls"],
        "seconds": seconds,
        "relay_cpu_ms_per_event": cpu_seconds * 1000 / events,
        "in_flight_twice": received["in_flight_twice"],
        "peak_calls_in_flight": received["peak_calls_in_flight"],
        **extra,
    }


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """These variables for the block, the process's own restored after it (other parts follow), with the
    product's cached settings and clients forgotten on the way in and out."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    config.get_settings.cache_clear()
    aws.reset_clients()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        config.get_settings.cache_clear()
        aws.reset_clients()


def _stream(
    bus: LatencyBus, template: Template, latencies: Sequence[int], orders: int
) -> list[dict[str, Any]]:
    relay = StreamRelay(template)
    relay.create_table()  # and with it the product's DynamoDB client, before the writers share it
    settings = config.get_settings()
    service = OrderService(DynamoOrderRepository(settings), settings)
    written, write_seconds = write_orders([service] * WRITERS, orders, "stream")
    records = relay.outbox_records()
    if len(records) != written:
        raise AssertionError(f"{len(records)} outbox records in the stream for {written} events written")
    handler = load_function("outbox_relay", "latency").lambda_handler
    aws.events()  # a warm function's client (its creation is the cold start's, measured apart)
    out = []
    for latency in latencies:
        bus.reset()
        bus.latency_seconds = latency / 1000
        seconds, cpu_seconds, invocations = relay.invoke(handler, records)
        out.append(
            figures(
                bus,
                latency,
                written,
                seconds,
                cpu_seconds,
                template.function(RELAY_FUNCTIONS["stream"]).memory_size,
                orders=orders,
                write_seconds=write_seconds,
                batch_size=relay.batch_size,
                invocations=invocations,
            )
        )
    return out


def drain(run_round: Callable[[], PublishOutcome[OutboxRow]]) -> tuple[int, int, float, float]:
    """Rounds until one takes nothing and reports no backlog: (events published, rounds, seconds, the
    process's CPU seconds meanwhile)."""
    events = rounds = 0
    cpu_started = time.process_time()
    started = time.perf_counter()
    with quiet():
        while True:
            outcome = run_round()
            if outcome.left_pending:
                raise AssertionError(
                    f"the bus takes every entry, yet {outcome.left_pending} were left pending"
                )
            events += len(outcome.published)
            if not outcome.taken and not outcome.backlog:
                break
            rounds += 1
            if time.perf_counter() - started > DRAIN_TIMEOUT_SECONDS:
                raise AssertionError(f"not drained after {DRAIN_TIMEOUT_SECONDS:.0f} s ({events} events)")
    return events, rounds, time.perf_counter() - started, time.process_time() - cpu_started


def _postgres(
    bus: LatencyBus,
    server: EmbeddedPostgres,
    template: Template,
    relay: str,
    latencies: Sequence[int],
    orders: int,
) -> list[dict[str, Any]]:
    location = server.database(f"bench_latency_{relay}")
    deployed = template.function(PUBLISHER_FUNCTION).environment
    environment = {
        # The deployed publisher's configuration (OrderStore=postgres, PostgresRelay=relay), on the
        # embedded server's socket (trust authentication: no secret).
        "ORDER_STORE": "postgres",
        "POSTGRES_RELAY": relay,
        "DATABASE_HOST": location.socket_dir,
        "DATABASE_PORT": str(location.port),
        "DATABASE_NAME": location.name,
        "DATABASE_USER": "postgres",
        "DATABASE_SECRET_ARN": "",
        "POWERTOOLS_SERVICE_NAME": "outbox-publisher",
        # Its PutEvents transport and calls in flight as the template deploys them.
        "PUBLISH_TRANSPORT": deployed.get("PUBLISH_TRANSPORT") or "sdk",
        "PUBLISH_CONCURRENCY": deployed["PUBLISH_CONCURRENCY"],
    }
    with _environment(environment):
        settings = config.get_settings()
        connection = order_database.connection_settings(settings)
        apply_migrations(connection)
        with psycopg.connect(
            host=location.socket_dir,
            port=location.port,
            dbname=location.name,
            user="postgres",
            autocommit=True,
        ) as admin:
            # The migration step's own code: the slot (named after the database, as the relay reads it)
            # when logical.
            switch_relay(admin, relay, slot_name(settings.database_name))
        writers = [Database(connection) for _ in range(WRITERS)]
        # The deployed function's round (functions/outbox_publisher/app.py): the configured relay's round
        # on the function's database connection, with its publisher, and its publish logs.
        publish_round = load_function("outbox_publisher", "latency").publish_round
        timeout = template.function(PUBLISHER_FUNCTION).timeout

        def run_round() -> PublishOutcome[OutboxRow]:
            # Each round with the deadline of an invocation begun now, as the function's handler begins
            # one (invocation.begin): a drain at a long latency may outlast one invocation's 70 s, and a
            # context another part left behind (a consumer's, long expired) must not cut the rounds short.
            invocation.begin(LambdaContext(function_name=PUBLISHER_FUNCTION, timeout_seconds=timeout))
            result: PublishOutcome[OutboxRow] = publish_round()
            return result

        # a warm function's client (its creation is the cold start's, measured apart)
        aws.put_events_client(settings.publish_transport)
        out = []
        try:
            services = [OrderService(PostgresOrderRepository(w, settings), settings) for w in writers]
            for latency in latencies:
                written, write_seconds = write_orders(services, orders, f"{relay}-{latency}")
                bus.reset()
                bus.latency_seconds = latency / 1000
                published, rounds, seconds, cpu_seconds = drain(run_round)
                if published != written:
                    raise AssertionError(f"{relay}: {published} events published of {written} written")
                out.append(
                    figures(
                        bus,
                        latency,
                        written,
                        seconds,
                        cpu_seconds,
                        template.function(RELAY_FUNCTIONS[relay]).memory_size,
                        orders=orders,
                        write_seconds=write_seconds,
                        rounds=rounds,
                    )
                )
        finally:
            for database in (*writers, order_database.order_database(settings)):
                database.close()
            order_database.order_database.cache_clear()
            server.drop(f"bench_latency_{relay}")
    return out


def run(
    dynamodb_url: str,
    data_dir: Path,
    latencies: Sequence[int] = LATENCIES_MS,
    stream_orders: int = STREAM_ORDERS,
    postgres_orders: int = POSTGRES_ORDERS,
) -> dict[str, list[dict[str, Any]]]:
    """{"stream": [...], "polling": [...], "logical": [...]}, one object per latency."""
    template = Template.load(stack_name=STACK_NAME)
    poison_queue = template.physical_name("RelayPoisonQueue")
    stream_relay = template.function(RELAY_FUNCTIONS["stream"]).environment
    with LatencyBus() as bus:
        environment = {
            # botocore reads AWS_ENDPOINT_URL_<service id>; EventBridge's id is "EventBridge".
            "AWS_ENDPOINT_URL_EVENTBRIDGE": bus.endpoint,
            "AWS_ENDPOINT_URL_EVENTS": bus.endpoint,
            # Nothing is parked (every event is valid); were one, SQS calls would fail on the bus, the
            # relay would report a checkpoint and the bench would stop rather than reach a real queue.
            "AWS_ENDPOINT_URL_SQS": bus.endpoint,
            "RELAY_POISON_QUEUE_URL": f"{bus.endpoint}/123456789012/{poison_queue}",
            "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_url,
            "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": dynamodb_url,
            "EVENT_BUS_NAME": template.physical_name("EventBus"),
            "ORDERS_TABLE_NAME": template.physical_name("OrdersTable"),
            "POWERTOOLS_METRICS_NAMESPACE": "Bench",
            "POWERTOOLS_SERVICE_NAME": "outbox-relay",
            # Calls in flight as the template deploys the relay (its RelayPublishConcurrency).
            "PUBLISH_CONCURRENCY": stream_relay["PUBLISH_CONCURRENCY"],
            "POWERTOOLS_TRACE_DISABLED": "true",
        }
        with _environment(environment), _log_level(template.parameter_values["LogLevel"]):
            results = {"stream": _stream(bus, template, latencies, stream_orders)}
            server = EmbeddedPostgres(data_dir)
            try:
                for relay in ("polling", "logical"):
                    results[relay] = _postgres(bus, server, template, relay, latencies, postgres_orders)
            finally:
                server.stop()
    return results


@contextlib.contextmanager
def _log_level(level: str) -> Iterator[None]:
    """The functions' log level as deployed by default (the template's LogLevel: INFO, a line per event
    published), whatever the process's was; restored after."""
    before = logger.log_level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def at(results: dict[str, Any], relay: str, latency_ms: int) -> dict[str, Any]:
    """One relay's figures at one latency (KeyError when not measured: a target then reads as missed)."""
    for row in results["relays_at_aws_latency"][relay]:
        if row["putevents_ms"] == latency_ms:
            return dict(row)
    raise KeyError(f"{relay} at {latency_ms} ms")


def calls_within_target(row: dict[str, Any]) -> bool:
    """At most 0.10 PutEvents calls per event, but for one short call per drain (a relay and latency's
    run: SHORT_CALLS_PER_DRAIN)."""
    return int(row["calls"]) <= math.ceil(int(row["events"]) * TARGET_CALLS_PER_EVENT) + SHORT_CALLS_PER_DRAIN


def every_row(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every relay's figures at every latency (KeyError when the part did not run)."""
    measured = results["relays_at_aws_latency"]
    return [row for relay in RELAYS for row in measured[relay]]


def render(measured: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "relays at AWS latency (each relay's code on its real source; the bus answers PutEvents after the "
        "latency)",
        "  relay      PutEvents ms   events/s   calls/event   out of order   peak calls in flight"
        "   relay CPU ms/event   events/s on Lambda",
    ]
    for relay in RELAYS:
        for row in measured.get(relay, []):
            cpu = row.get("relay_cpu_ms_per_event")  # absent from reports before it was measured
            on_lambda = on_lambda_text(row)
            lines.append(
                f"  {relay:<10} {row['putevents_ms']:>12} {row['events_per_s']:>10.0f} "
                f"{row['calls_per_event']:>13.4f} {row['out_of_order']:>14} {row['peak_calls_in_flight']:>22}"
                f" {'-' if cpu is None else f'{cpu:.2f}':>20} {on_lambda:>20}"
            )
    return lines


def on_lambda(row: dict[str, Any]) -> float:
    """The events/s a target reads: as the deployed function moves them (the measured rate in reports from
    before its vCPU share was counted)."""
    return float(row.get("events_per_s_on_lambda", row["events_per_s"]))


def on_lambda_text(row: dict[str, Any]) -> str:
    if "events_per_s_on_lambda" not in row:
        return "-"
    return f"{row['events_per_s_on_lambda']:,.0f} ({row['lambda_memory_mb']} MB)"
