"""Cost per 1 million orders through the whole saga, from the figures `make bench` measured.

    python -m tools.bench.cost_model            # reads .bench/latest.json, prints a markdown table

Prices: public us-east-1 list prices as published on the AWS pricing pages, read 2026-11-21
(on-demand, no free tier, arm64 Lambda). Change PRICES when they change. Beside the deployed relays it
prices EventBridge Pipes as the DynamoDB store's relay (PIPES_PRICES, docs/performance.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tools.template import ROOT

PRICES_DATE = "2026-11-21"
PRICES = {
    "api_gateway_rest_per_million": 3.50,
    "lambda_request_per_million": 0.20,
    "lambda_arm64_gb_second": 0.0000133334,
    "dynamodb_write_request_unit_per_million": 0.625,
    "dynamodb_read_request_unit_per_million": 0.125,
    "eventbridge_custom_event_per_million": 1.00,
    "sqs_standard_request_per_million": 0.40,
    "sns_publish_per_million": 0.50,
}
MEMORY_GB = 0.5  # every function's MemorySize (512 MB)
EVENTS_PER_ORDER = 3  # OrderCreated, InventoryReserved, OrderConfirmed on the confirm path
CONSUMED_PER_ORDER = 3  # one message for each consumer
# An SQS message costs the EventBridge delivery (SendMessage) plus its share of the batched
# ReceiveMessage and DeleteMessageBatch calls of the Lambda poller (batches of 10).
SQS_REQUESTS_PER_MESSAGE = 1.2
# Consumer and API invocations: measured CPU is not billed duration; assume 50 ms each (DynamoDB
# round trips dominate, and they are the same for both relays).
HANDLER_MS = 50.0


def cost_per_million_orders(bench: dict[str, Any], relay: str) -> dict[str, float]:
    relay_figures = bench["relay"][relay]
    wc = bench["write_cost"]
    writes = wc["create"]["wcu_aws"] + sum(c["wcu_aws"] for c in wc["consumers"].values())
    reads = sum(c["calls"].get("GetItem", 0) for c in wc["consumers"].values())
    relay_invocations = relay_figures["invocations_per_order_full_batches"]
    relay_seconds = relay_figures["cpu_ms_per_1000_events"] / 1000 * EVENTS_PER_ORDER / 1000
    handler_seconds = (1 + CONSUMED_PER_ORDER) * HANDLER_MS / 1000
    million = 1_000_000
    lines = {
        "API Gateway": PRICES["api_gateway_rest_per_million"],
        "Lambda requests": PRICES["lambda_request_per_million"]
        * (1 + CONSUMED_PER_ORDER / 10 + relay_invocations),
        "Lambda duration": million
        * MEMORY_GB
        * PRICES["lambda_arm64_gb_second"]
        * (handler_seconds + relay_seconds),
        "DynamoDB writes": PRICES["dynamodb_write_request_unit_per_million"] * writes,
        "DynamoDB reads": PRICES["dynamodb_read_request_unit_per_million"] * reads,
        "EventBridge": PRICES["eventbridge_custom_event_per_million"] * EVENTS_PER_ORDER,
        "SQS": PRICES["sqs_standard_request_per_million"] * SQS_REQUESTS_PER_MESSAGE * CONSUMED_PER_ORDER,
        "SNS": PRICES["sns_publish_per_million"],
    }
    lines["total"] = sum(lines.values())
    return lines


# --- OrderStore=postgres -------------------------------------------------------------------------------
POSTGRES_PRICES = {
    "aurora_acu_hour": 0.12,  # Aurora Serverless v2, Aurora Standard
    "aurora_io_per_million": 0.20,
    "aurora_storage_gb_month": 0.10,
    "interface_endpoint_az_hour": 0.01,
    "scheduler_invocation_per_million": 1.00,
}
HOURS_PER_MONTH = 730
MIN_ACU = 0.5  # DatabaseMinCapacity's default
INTERFACE_ENDPOINTS = 5  # nested/order-database.yaml: secretsmanager, events, sqs, sns, xray
ZONES = 2
STORAGE_GB = 10  # a small order history; the outbox is kept OutboxTtlDays only
SCHEDULES = 2  # the publisher and the maintenance, every minute
PUBLISHER_SECONDS_PER_MINUTE = 65  # one invocation a minute, polling until its last 5 s of 70
# Assumptions, not measurements: AWS publishes an ACU as "approximately 2 GiB of memory, corresponding
# CPU, and networking", not a CPU share; a quarter of a vCPU per ACU is taken here. Aurora bills I/O
# on storage, not on the buffer cache: the confirm path's commits are taken as one write I/O each, its
# reads as cached: the API's and the order-status consumer's, plus the polling publisher's mark; the
# logical relay marks nothing, and reads the log through Aurora's logical WAL cache (rds.logical_wal_cache).
VCPU_PER_ACU = 0.25
AURORA_WRITE_IOS_PER_ORDER = {"polling": 3, "logical": 2}
POSTGRES_RELAYS = ("polling", "logical")


def _orders_table_wcu(bench: dict[str, Any]) -> float:
    """The write units of the orders table on the confirm path: what the postgres store does not pay."""
    wc = bench["write_cost"]
    parts = [wc["create"], wc["consumers"]["order_status_consumer"]]
    return sum(
        float(write["wcu_aws"])
        for part in parts
        for write in part["writes"]
        if write["item"].startswith("OrdersTable")
    )


def postgres_fixed_per_month() -> dict[str, float]:
    prices = POSTGRES_PRICES
    publisher_gb_seconds = MEMORY_GB * PUBLISHER_SECONDS_PER_MINUTE * 60 * HOURS_PER_MONTH
    return {
        "Aurora minimum capacity": MIN_ACU * prices["aurora_acu_hour"] * HOURS_PER_MONTH,
        "Aurora storage": STORAGE_GB * prices["aurora_storage_gb_month"],
        "VPC interface endpoints": INTERFACE_ENDPOINTS
        * ZONES
        * prices["interface_endpoint_az_hour"]
        * HOURS_PER_MONTH,
        "publisher Lambda (always polling)": publisher_gb_seconds * PRICES["lambda_arm64_gb_second"],
        "EventBridge Scheduler": SCHEDULES
        * 60
        * HOURS_PER_MONTH
        / 1e6
        * prices["scheduler_invocation_per_million"],
    }


def postgres_cost_per_million_orders(bench: dict[str, Any], relay: str = "polling") -> dict[str, float]:
    """The variable cost of 1 million orders with OrderStore=postgres and PostgresRelay=`relay`, from the
    same run's figures."""
    lines = dict(cost_per_million_orders(bench, "ours"))
    del lines["total"]
    # Only the inventory's events still go through the stream relay: one of the confirm path's three.
    stream_relay = bench["relay"]["ours"]
    relay_share = 1 / EVENTS_PER_ORDER
    relay_seconds = stream_relay["cpu_ms_per_1000_events"] / 1000 * EVENTS_PER_ORDER / 1000
    lines["Lambda requests"] -= (
        PRICES["lambda_request_per_million"]
        * stream_relay["invocations_per_order_full_batches"]
        * (1 - relay_share)
    )
    lines["Lambda duration"] -= (
        1_000_000 * MEMORY_GB * PRICES["lambda_arm64_gb_second"] * relay_seconds * (1 - relay_share)
    )
    lines["DynamoDB writes"] -= PRICES["dynamodb_write_request_unit_per_million"] * _orders_table_wcu(bench)
    publisher = bench["postgres_relays"][relay]["throughput"]
    database_cpu_seconds = (
        publisher["database_write_cpu_ms_per_order"]
        + publisher["database_cpu_ms_per_event"] * publisher["events"] / publisher["orders"]
    ) / 1000
    lines["Aurora capacity above the minimum"] = (
        1_000_000 * database_cpu_seconds / VCPU_PER_ACU / 3600 * POSTGRES_PRICES["aurora_acu_hour"]
    )
    lines["Aurora I/O"] = AURORA_WRITE_IOS_PER_ORDER[relay] * POSTGRES_PRICES["aurora_io_per_million"]
    lines["total"] = sum(lines.values())
    return lines


def break_even_orders_per_month(bench: dict[str, Any], relay: str = "polling") -> float | None:
    """The monthly order count above which the postgres store costs less (None: it never does)."""
    saving = (
        cost_per_million_orders(bench, "ours")["total"]
        - postgres_cost_per_million_orders(bench, relay)["total"]
    )
    if saving <= 0:
        return None
    return sum(postgres_fixed_per_month().values()) / saving * 1_000_000


# --- EventBridge Pipes instead of the relay (OrderStore=dynamodb; priced for comparison, not deployed) -----
# A pipe per table: the stream, the relay's FilterCriteria (outbox items only), an optional enrichment, the
# bus as the target; no relay Lambda. Sources (docs/performance.md, "EventBridge Pipes as the relay"):
# - $0.40 per million requests after filtering, each 64 KB chunk of payload a request (EventBridge pricing
#   page). Whether a batch of stream records is one request or one per record the pages read do not say:
#   one per record (an outbox record is ~1-2 KB), the upper reading; PIPE_BATCH_READING is the other.
# - An event-bus target takes at most 10 records a batch, and a pipe cannot have a larger batch size than
#   its target takes (user guide, eb-pipes-batching-concurrency): one PutEvents of <= 10 entries a batch.
#   The bus charges per event, not per call: the EventBridge line is the relay's.
# - Stream reads: free for Lambda only, "calls made by consumers of any other kind are charged" (DynamoDB
#   developer guide, CostOptimization_StreamsUsage); a pipe polls each shard 4 times a second
#   (eb-pipes-dynamodb), idle or not: a month per shard, not a cost per order.
# - Enrichment (variant "enrichment"): a Lambda that turns each record's NewImage into the CloudEvents
#   envelope the relay publishes (an input transformer cannot: it inserts a string attribute as a string,
#   and parses JSON only in SQS bodies, Kinesis/MQ data and Kafka keys/values: eb-pipes-input-transformation).
#   Invoked once per batch of 10 (full batches, as the relay's row assumes); its CPU per event is taken
#   as the relay's measured one, an upper bound: it makes no PutEvents call.
PIPES_PRICES = {
    "pipes_request_per_million": 0.40,
    "dynamodb_streams_read_request_per_million": 0.20,  # $0.02 per 100,000 GetRecords calls
}
PIPE_VARIANTS = ("transformer", "enrichment")
PIPE_BUS_BATCH = 10
PIPE_REQUESTS_PER_EVENT = 1.0  # one request per record after filtering
PIPE_BATCH_READING = 1 / PIPE_BUS_BATCH  # one request per batch of 10 records (one 64 KB chunk)
PIPE_POLLS_PER_SHARD_SECOND = 4
STREAM_SHARDS = 2  # OrdersTable's and InventoryTable's streams, at least one shard each


def _lambda_duration(seconds_per_order: float) -> float:
    """Lambda duration of 1 million orders at `seconds_per_order` (arm64, MEMORY_GB)."""
    return 1_000_000 * MEMORY_GB * PRICES["lambda_arm64_gb_second"] * seconds_per_order


def pipes_cost_per_million_orders(
    bench: dict[str, Any], variant: str = "enrichment", requests_per_event: float = PIPE_REQUESTS_PER_EVENT
) -> dict[str, float]:
    """The variable cost of 1 million orders on the DynamoDB store with a pipe per table as the relay:
    the relay's invocations and duration go, the pipes' requests come (and, with `variant` "enrichment",
    the enrichment Lambda's invocations and duration)."""
    if variant not in PIPE_VARIANTS:
        raise ValueError(f"variant must be one of {PIPE_VARIANTS}, not {variant!r}")
    lines = dict(cost_per_million_orders(bench, "ours"))
    del lines["total"]
    relay = bench["relay"]["ours"]
    enrichment_invocations = EVENTS_PER_ORDER / PIPE_BUS_BATCH if variant == "enrichment" else 0.0
    lines["Lambda requests"] += PRICES["lambda_request_per_million"] * (
        enrichment_invocations - relay["invocations_per_order_full_batches"]
    )
    if variant == "transformer":  # the enrichment's duration is taken as the relay's: unchanged then
        relay_seconds = relay["cpu_ms_per_1000_events"] / 1000 * EVENTS_PER_ORDER / 1000
        lines["Lambda duration"] -= _lambda_duration(relay_seconds)
    lines["EventBridge Pipes"] = (
        PIPES_PRICES["pipes_request_per_million"] * requests_per_event * EVENTS_PER_ORDER
    )
    lines["total"] = sum(lines.values())
    return lines


def pipes_fixed_per_month(shards: int = STREAM_SHARDS) -> dict[str, float]:
    """What the pipes cost a month whatever the orders: their polling of every shard (the relay's is free)."""
    reads = shards * PIPE_POLLS_PER_SHARD_SECOND * 3600 * HOURS_PER_MONTH
    return {
        "DynamoDB Streams reads (pipes polling)": reads
        / 1_000_000
        * PIPES_PRICES["dynamodb_streams_read_request_per_million"]
    }


def render_relays(bench: dict[str, Any]) -> list[str]:
    """The DynamoDB store's relays side by side: this project's, the naive baseline, and a pipe per table
    with an input transformer only (not equivalent: see the note) or with an enrichment Lambda."""
    columns = {
        "stream relay (this project)": cost_per_million_orders(bench, "ours"),
        "baseline relay": cost_per_million_orders(bench, "baseline"),
        "Pipe, input transformer": pipes_cost_per_million_orders(bench, "transformer"),
        "Pipe + enrichment Lambda": pipes_cost_per_million_orders(bench, "enrichment"),
    }
    names = list(dict.fromkeys(name for lines in columns.values() for name in lines))
    names.remove("total")
    rows = [
        f"| {name} | " + " | ".join(f"${lines.get(name, 0.0):,.2f}" for lines in columns.values()) + " |"
        for name in names
    ]
    totals = " | ".join(f"**${lines['total']:,.2f}**" for lines in columns.values())
    rows.append(f"| **variable, per million orders** | {totals} |")
    fixed = sum(pipes_fixed_per_month().values())
    month = f"${fixed:,.2f}"
    rows.append(
        f"| **fixed, per month** ({STREAM_SHARDS} stream shards) | $0.00 | $0.00 | {month} | {month} |"
    )
    batch = pipes_cost_per_million_orders(bench, "enrichment", PIPE_BATCH_READING)
    return [
        "| Item | " + " | ".join(columns) + " |",
        "| --- |" + " ---: |" * len(columns),
        *rows,
        "",
        "The input transformer alone cannot publish the relay's envelope (the detail would carry it as a "
        "JSON string): a floor, not an equivalent.",
        f"Pipes requests at one per record after filtering; if a batch of {PIPE_BUS_BATCH} records is one "
        f"request, EventBridge Pipes costs ${batch['EventBridge Pipes']:,.2f} and the enriched pipe "
        f"${batch['total']:,.2f} per million orders.",
    ]


def render(bench: dict[str, Any]) -> str:
    lines = [
        f"Per 1 million orders (us-east-1 list prices of {PRICES_DATE}, from `.bench/latest.json`):",
        "",
        *render_relays(bench),
    ]
    if "postgres_relays" in bench:
        lines += ["", *render_order_stores(bench)]
    return "\n".join(lines)


def render_order_stores(bench: dict[str, Any]) -> list[str]:
    dynamodb = cost_per_million_orders(bench, "ours")
    postgres = {relay: postgres_cost_per_million_orders(bench, relay) for relay in POSTGRES_RELAYS}
    fixed = postgres_fixed_per_month()
    names = list(dict.fromkeys([*dynamodb, *postgres["polling"]]))
    names.remove("total")

    def cells(name: str) -> str:
        return " | ".join(f"${postgres[relay].get(name, 0.0):,.2f}" for relay in POSTGRES_RELAYS)

    rows = [f"| {name} | ${dynamodb.get(name, 0.0):,.2f} | {cells(name)} |" for name in names]
    totals = " | ".join(f"**${postgres[relay]['total']:,.2f}**" for relay in POSTGRES_RELAYS)
    rows.append(f"| **variable, per million orders** | **${dynamodb['total']:,.2f}** | {totals} |")
    rows += [f"| {name} (per month) | - | ${value:,.2f} | ${value:,.2f} |" for name, value in fixed.items()]
    month = f"${sum(fixed.values()):,.2f}"
    rows.append(f"| **fixed, per month** | **$0.00** | **{month}** | **{month}** |")
    verdicts = []
    for relay in POSTGRES_RELAYS:
        even = break_even_orders_per_month(bench, relay)
        verdicts.append(
            f"Break-even with PostgresRelay={relay}: {even:,.0f} orders a month "
            f"({even / (30 * 86400):.1f} orders/s on average); above it the postgres store costs less."
            if even is not None
            else f"PostgresRelay={relay}: the postgres store costs more per order; no break-even."
        )
    return [
        "Order stores side by side (OrderStore=dynamodb vs postgres with each PostgresRelay; ACU per vCPU and"
        " Aurora I/O per order are assumptions, see cost_model.py):",
        "",
        "| Item | dynamodb | postgres, polling | postgres, logical |",
        "| --- | ---: | ---: | ---: |",
        *rows,
        "",
        *verdicts,
    ]


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".bench" / "latest.json"
    print(render(json.loads(path.read_text())))
