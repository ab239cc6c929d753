"""A fourth consumer from exactly the lines docs/extending.md shows, run by the unchanged local stack.

The test writes a copy of template.source.yaml with the documented row, access policy and collection
entries (the receipt consumer of tests/fixtures/), checks that the diff is as long as the page says,
writes its loops out as `make template` does, starts the local stack from the result and creates an
order through the API: the new consumer must receive the OrderCreated event from its own queue and
apply it (publish the receipt).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import start_stack, stop_stack
from tests.local_stacks import created_order
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import ROOT, TEMPLATE_PATH, Template
from tools.template.generate import SOURCE_PATH, generate

DOC = (ROOT / "docs" / "extending.md").read_text()
RECEIPT_SECONDS = 20.0  # a bound on waiting, not a speed target
# The consumers' rows end here; the effect policies end before the alarms' banner.
LAST_ROW = "      DetailTypes: [OrderConfirmed, OrderRejected, OrderCancelled]\n"
ALARMS_BANNER = "  # " + "=" * 99 + "\n  # Alarms, their topic and the dashboard"


def documented_block(name: str) -> str:
    [block] = re.findall(rf"```yaml {name}\n(.*?)```", DOC, re.S)
    return str(block)


def documented_count(what: str) -> int:
    [count] = re.findall(rf"\*\*(\d+) {what} lines\*\*", DOC)
    return int(count)


def with_receipt_consumer(text: str) -> str:
    """template.source.yaml plus the receipt consumer, as docs/extending.md says to add it."""
    assert text.count(LAST_ROW) == 1
    assert text.count(ALARMS_BANNER) == 1
    assert text.count("Notification]") == 5, "the five collections of the function and consumer loops"
    text = text.replace(LAST_ROW, LAST_ROW + documented_block("receipt-row"))
    text = text.replace(ALARMS_BANNER, documented_block("receipt-access") + "\n" + ALARMS_BANNER)
    return text.replace("Notification]", "Notification, Receipt]")


def test_adding_a_consumer_takes_the_lines_the_page_counts():
    before = SOURCE_PATH.read_text().splitlines()
    after = with_receipt_consumer(SOURCE_PATH.read_text()).splitlines()
    diff = list(difflib.unified_diff(before, after, lineterm="", n=0))
    plus = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
    minus = [line for line in diff if line.startswith("-") and not line.startswith("---")]
    assert len(minus) == documented_count("changed")
    assert len(plus) - len(minus) == documented_count("added")


@pytest.fixture(scope="module")
def receipt_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("added-consumer")
    path = workdir / "template.yaml"
    path.write_text(generate(with_receipt_consumer(SOURCE_PATH.read_text())))
    options = StackOptions(
        api_port=0,
        data_dir=workdir / "stack",
        seed_file=None,
        only_functions=frozenset({"OrdersApiFunction", "OutboxRelayFunction", "ReceiptFunction"}),
    )
    stack = start_stack(Template.load(path, stack_name="receipts"), options, local_services)
    yield stack
    stop_stack(stack)


def receipts(stack: LocalStack, order_id: str) -> list[dict[str, Any]]:
    messages = [json.loads(p.message) for p in stack.activity.publications()]
    return [m for m in messages if "receipt" in m and m.get("orderId") == order_id]


def test_the_added_consumer_receives_and_applies_its_events(receipt_stack: LocalStack):
    # Given the copy of the template, read by the local stack's unchanged code: the whole consumer
    template = receipt_stack.template
    for part in ("Queue", "DeadLetterQueue", "Rule", "QueuePolicy", "FunctionRole", "EffectPolicy"):
        assert f"Receipt{part}" in template.resources, part
    for alarm in ("QueueAge", "DeadLetterQueue", "Errors", "Throttles"):
        assert f"Receipt{alarm}Alarm" in template.resources, alarm
    spec = template.function("ReceiptFunction")
    assert spec.code_uri == ROOT / "tests" / "fixtures" / "receipt_consumer"
    assert spec.environment["POWERTOOLS_SERVICE_NAME"] == "receipt-consumer"
    assert receipt_stack.sources.queues, "the stack polls the consumers' queues"
    assert "ReceiptQueue" in {source.queue for source in receipt_stack.sources.queues}

    # When an order is created through the API
    order = created_order(receipt_stack, "c-receipt", [{"sku": "SKU-R", "quantity": 3, "unitPrice": 250}])
    order_id = order["orderId"]

    # Then its OrderCreated reached the receipt consumer through its rule and queue, and it applied it
    [receipt] = receipt_stack.wait_for(
        lambda: receipts(receipt_stack, order_id) or None, RECEIPT_SECONDS, f"a receipt for {order_id}"
    )
    assert receipt["totalAmount"] == 750
    queue_arn = template.arn("ReceiptQueue")

    def delivered() -> list[dict[str, Any]] | None:
        records = [
            record
            for invocation in receipt_stack.activity.invocations("ReceiptFunction")
            for record in invocation.records
            if record["eventSourceARN"] == queue_arn and order_id in record["body"]
        ]
        return records or None

    [record] = receipt_stack.wait_for(delivered, RECEIPT_SECONDS, f"ReceiptFunction invoked for {order_id}")
    assert json.loads(record["body"])["detail-type"] == "OrderCreated"


def test_the_copy_leaves_template_yaml_alone():
    # The copy is written elsewhere; the consumers defined in the repository are still the three.
    assert "Receipt" not in TEMPLATE_PATH.read_text()
    assert "Receipt" not in SOURCE_PATH.read_text()
    assert Path(ROOT / "tests" / "fixtures" / "receipt_consumer" / "app.py").is_file()
