"""The local inspector (tools/local/inspector) in a real browser: headless Chromium from the OS packages
(`make browser`), driven by Playwright, against local stacks. Skipped, with the reason printed, where
there is no Chromium (CHROMIUM=<path> points elsewhere than /usr/bin/chromium).

- An order placed through the API appears on the open page without a reload, and its timeline shows
  every hop of the saga in order, each with its outcome, event and retries.
- A record the relay parked (the bus refused it) shows in the poison queue view; the page's redrive runs
  `python -m operations redrive-poison`, which republishes it, and shows the command's report, including
  the message it had to keep. A queue with nothing to redrive has no button.
- An unknown order id gets a clear message.
- A thread of the stack that stopped or restarted shows as a banner (GET /_local/api/health).

With CI=true a missing Chromium fails the run instead (the first test here, saying why): a CI run that
skipped these tests would pass a page nobody opened.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests

from shop.adapters.dynamodb import keys
from shop.adapters.dynamodb.outbox_items import outbox_item
from shop.domain.envelope import CloudEvent, format_time, now
from shop.domain.orders import EVENT_SOURCE, ORDER_CONFIRMED
from tests.local_stacks import start_stack, stop_stack
from tools.chaos import refusals
from tools.local.inspector.browser import browser_tests_gate
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.local.tests.saga_entries import CONFIRMED_SAGA_HOPS
from tools.template import Template

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

# ("run", None), ("skip", why) where there is no Chromium, ("fail", why) where there is none and CI is set.
GATE, WHY = browser_tests_gate()
pytestmark = pytest.mark.skipif(GATE == "skip", reason=str(WHY))

SAGA_MS = 20_000  # a bound on waiting, not a speed target
COMMAND_MS = 60_000  # a redrive runs `python -m operations` in a process of its own
NOT_RETRIED = "\u2013"  # the page's dash for a request or publication: nothing to retry
# The page says data-event-type="" for the API request.
SAGA = [(function, event_type or "") for function, event_type in CONFIRMED_SAGA_HOPS]


def test_ci_has_the_chromium_the_browser_tests_need() -> None:
    """Passes where Chromium is; fails with CI set and no Chromium (elsewhere the module is skipped)."""
    if GATE == "fail":
        pytest.fail(str(WHY), pytrace=False)


def rows(page: Page) -> Locator:
    return page.locator('[data-testid="hop-row"]')


def test_an_order_placed_through_the_api_appears_live_with_every_hop_in_order(
    local_stack: LocalStack, page: Page
) -> None:
    from playwright.sync_api import expect

    customer = f"c-inspect-{uuid.uuid4().hex[:8]}"
    page.goto(local_stack.inspector_url)
    page.fill("#customer-filter", customer)
    expect(page.get_by_test_id("orders-count")).to_contain_text("0 of")

    response = requests.post(
        f"{local_stack.api_url}/orders",
        json={
            "customerId": customer,
            "currency": "USD",
            "items": [{"sku": "SKU-RED-MUG", "quantity": 1, "unitPrice": 1250}],
        },
        headers={"Idempotency-Key": str(uuid.uuid4()), "X-Correlation-Id": f"corr-{customer}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    order_id = response.json()["orderId"]

    # The page polls: the order shows up, then turns CONFIRMED, with no reload.
    row = page.locator(f'[data-testid="order-row"][data-order-id="{order_id}"]')
    expect(row.get_by_test_id("order-status")).to_have_text("CONFIRMED")
    page.select_option("#status-filter", "REJECTED")
    expect(row).to_have_count(0)
    page.select_option("#status-filter", "CONFIRMED")
    row.get_by_role("link").click()

    expect(page.get_by_test_id("order-id")).to_have_text(order_id)
    expect(rows(page).and_(page.locator('[data-trigger="sns"]'))).to_have_count(1)  # the saga's last hop
    hops = [(r.get_attribute("data-function"), r.get_attribute("data-event-type")) for r in rows(page).all()]
    assert hops == SAGA
    assert [r.get_attribute("data-outcome") for r in rows(page).all()] == ["ok"] * len(SAGA)
    # Parents from the trace headers, as X-Ray draws them: the relay's publications continue the API's
    # trace (child); each consumer's invocation is linked to the trace on its message, which the
    # publication of its event put there; the SNS publication under its consumer.
    assert [r.get_attribute("data-depth") for r in rows(page).all()] == ["0", *["1", "2"] * 3, "3"]
    assert [r.get_attribute("data-relation") for r in rows(page).all()] == [
        "",
        *["child", "linked"] * 3,
        "",
    ]
    assert rows(page).get_by_test_id("hop-retries").all_inner_texts() == [
        NOT_RETRIED,
        *["0"] * 6,
        NOT_RETRIED,
    ]
    event_ids = [r.get_attribute("data-event-id") for r in rows(page).all()]
    # The relay's and the consumer's hop of one event carry its id; each event of the saga is another.
    assert event_ids[1] == event_ids[2] != event_ids[3] == event_ids[4] != event_ids[5] == event_ids[6]
    expect(rows(page).first).to_contain_text("POST /orders 201")


def test_an_unknown_order_id_gets_a_clear_message(local_stack: LocalStack, page: Page) -> None:
    from playwright.sync_api import expect

    page.goto(f"{local_stack.inspector_url}#/orders/o-does-not-exist")

    banner = page.get_by_test_id("error-banner")
    expect(banner).to_have_attribute("data-code", "order_not_found")
    expect(banner).to_contain_text("no order 'o-does-not-exist' in local-OrdersTable")


# --- the poison queue -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def refusing_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalStack, Path]]:
    """A stack of its own whose bus refuses the events listed in a file, as EventBridge refuses an entry
    (tools/chaos/refusals.py, loaded into the function workers): moto itself refuses nothing the relay
    sends. The operator commands the page runs are not wrapped: they see the bus as it is."""
    data_dir = tmp_path_factory.mktemp("inspector-stack")
    refused = data_dir / "refused-event-ids.txt"
    refused.write_text("")
    options = StackOptions(
        api_port=0,
        data_dir=data_dir,
        seed_file=None,
        function_environment={"LOCAL_WORKER_PRELOAD": refusals.__file__, refusals.REFUSALS_ENV: str(refused)},
    )
    stack = start_stack(Template.load(stack_name="inspector"), options, local_services)
    yield stack, refused
    stop_stack(stack)


def confirmed_event() -> CloudEvent:
    """An OrderConfirmed of an order of its own: only the notification consumer takes it."""
    order_id = f"o-{uuid.uuid4().hex}"
    return CloudEvent.new(
        source=EVENT_SOURCE,
        type=ORDER_CONFIRMED,
        subject=order_id,
        sequence=2,
        data={"orderId": order_id, "customerId": "c-poison", "status": "CONFIRMED"},
        correlation_id=f"corr-{order_id}",
    )


def write_order(stack: LocalStack, event: CloudEvent, envelope: str | None = None) -> None:
    """The event's order item and its outbox item, written to the OrdersTable as the order service writes
    them (the envelope replaced when given: poison the relay cannot decode)."""
    relay = stack.template.function("OutboxRelayFunction").environment
    item = outbox_item(
        event,
        keys.order_partition(event.subject),
        ttl_days=int(relay["OUTBOX_TTL_DAYS"]),
        time_shards=int(relay.get("OUTBOX_TIME_SHARDS", "8")),
        max_event_bytes=int(relay["MAX_EVENT_BYTES"]),
    )
    if envelope is not None:
        item["envelope"] = {"S": envelope}
    stamp = format_time(now())
    order = {
        **keys.order_key(event.subject),
        "orderId": {"S": event.subject},
        "customerId": {"S": "c-poison"},
        "status": {"S": "CONFIRMED"},
        "version": {"N": "2"},
        "totalAmount": {"N": "100"},
        "currency": {"S": "USD"},
        "createdAt": {"S": stamp},
        "updatedAt": {"S": stamp},
    }
    dynamodb = stack.clients.dynamodb()
    table = stack.template.physical_name("OrdersTable")
    dynamodb.put_item(TableName=table, Item=order)
    dynamodb.put_item(TableName=table, Item=item)


def redrive_from_the_page(page: Page, action: str) -> None:
    from playwright.sync_api import expect

    page.get_by_test_id(f"action-{action}").click()
    expect(page.get_by_test_id("confirm-dialog")).to_contain_text(f"python -m operations {action}")
    page.get_by_test_id("confirm-yes").click()


def test_a_parked_record_shows_in_the_poison_queue_and_a_redrive_from_the_page_republishes_it(
    refusing_stack: tuple[LocalStack, Path], page: Page
) -> None:
    from playwright.sync_api import expect

    stack, refused_ids = refusing_stack
    refused, undecodable = confirmed_event(), confirmed_event()
    refused_ids.write_text(refused.id)
    write_order(stack, refused)  # the bus refuses it: the relay parks it
    write_order(stack, undecodable, envelope="{not a CloudEvent")  # the relay cannot decode it: parked

    page.goto(f"{stack.inspector_url}#/queues")
    poison_queue = page.locator('[data-testid="queue-card"][data-queue="RelayPoisonQueue"]')
    parked = poison_queue.get_by_test_id("queue-message")
    expect(parked).to_have_count(2)
    expect(parked.filter(has_text=refused.id)).to_contain_text("MalformedDetail")
    expect(parked.filter(has_text=undecodable.id)).to_contain_text("envelope")
    expect(poison_queue.get_by_test_id("queue-visible")).to_have_text("2")

    refused_ids.write_text("")  # the cause fixed: the bus takes it now
    redrive_from_the_page(page, "redrive-poison")

    # The command's report, not a bare success: one republished, the undecodable one kept, and why.
    report = page.get_by_test_id("action-report")
    expect(report).to_have_attribute("data-state", "incomplete", timeout=COMMAND_MS)
    expect(report.get_by_test_id("action-summary")).to_have_text("redriven 1 · kept 1 · parked 0")
    expect(report).to_contain_text(f"event {undecodable.id} is still unpublishable")
    expect(report).to_contain_text("python -m operations --bus inspector-EventBus")
    expect(poison_queue.get_by_test_id("queue-visible")).to_have_text("1")
    expect(parked).to_have_count(1)
    expect(parked).to_contain_text(undecodable.id)

    # Republished: on the bus, so the notification consumer handles it, as the order's timeline shows.
    page.goto(f"{stack.inspector_url}#/orders/{refused.subject}")
    expect(rows(page).and_(page.locator('[data-trigger="sns"]'))).to_have_count(1)
    assert [
        (r.get_attribute("data-function"), r.get_attribute("data-outcome"), r.get_attribute("data-event-id"))
        for r in rows(page).all()
    ] == [
        ("OutboxRelayFunction", "parked", refused.id),
        ("NotificationFunction", "ok", refused.id),
        ("NotificationTopic", "ok", refused.id),
    ]

    # Nothing in the relay dead-letter queue: no button to redrive it.
    page.goto(f"{stack.inspector_url}#/queues")
    dead_letters = page.locator('[data-testid="queue-card"][data-queue="RelayDeadLetterQueue"]')
    expect(dead_letters.get_by_test_id("queue-visible")).to_have_text("0")
    expect(dead_letters.get_by_test_id("action-redrive")).to_have_count(0)


# --- the stack's threads --------------------------------------------------------------------------------
def test_a_stopped_or_restarted_thread_of_the_stack_shows_as_a_banner(
    local_stack: LocalStack, page: Page
) -> None:
    """GET /_local/api/health as the stack answers it (all well: no banner), then answered by the test
    (Playwright's route): a thread that stopped and one that restarted; a stack without the endpoint (404)."""
    from playwright.sync_api import Route, expect

    banner = page.get_by_test_id("health-banner")
    page.goto(local_stack.inspector_url)
    expect(page.locator("#updated")).to_contain_text("updated")
    expect(banner).to_be_hidden()

    threads = [
        {"name": "stream-OrdersTable", "alive": False, "restarts": 0, "error": "RecursionError: too deep"},
        {"name": "queue-InventoryQueue", "alive": True, "restarts": 2, "error": "ValueError: bad record"},
        {"name": "topic-NotificationTopic", "alive": True, "restarts": 0, "error": None},
    ]
    answer: dict[str, Any] = {"status": 200, "json": {"threads": threads}}

    def health(route: Route) -> None:
        route.fulfill(**answer)

    page.route("**/_local/api/health", health)
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("The stack is not running whole")
    troubled = banner.get_by_test_id("health-thread")
    expect(troubled).to_have_count(2)  # the healthy one is not listed
    expect(troubled.nth(0)).to_have_text("stream-OrdersTable stopped — last error: RecursionError: too deep")
    expect(troubled.nth(1)).to_have_text(
        "queue-InventoryQueue restarted 2 time(s) — last error: ValueError: bad record"
    )

    answer.update(status=404, json={"error": {"code": "not_found", "message": "no inspector endpoint"}})
    expect(banner).to_be_hidden()
    expect(page.get_by_test_id("error-banner")).to_be_hidden()  # a stack without the endpoint is no error
