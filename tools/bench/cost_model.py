"""Cost per 1 million orders through the whole saga, from the figures `make bench` measured.

    python -m tools.bench.cost_model            # reads .bench/latest.json, prints a markdown table

Prices: public us-east-1 list prices as published on the AWS pricing pages, read 2026-11-21
(on-demand, no free tier, arm64 Lambda). Change PRICES when they change.
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


def render(bench: dict[str, Any]) -> str:
    ours = cost_per_million_orders(bench, "ours")
    baseline = cost_per_million_orders(bench, "baseline")
    rows = [f"| {name} | ${ours[name]:,.2f} | ${baseline[name]:,.2f} |" for name in ours]
    return "\n".join(
        [
            f"Per 1 million orders (us-east-1 list prices of {PRICES_DATE}, from `.bench/latest.json`):",
            "",
            "| Item | This project | Baseline relay |",
            "| --- | ---: | ---: |",
            *rows,
        ]
    )


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".bench" / "latest.json"
    print(render(json.loads(path.read_text())))
