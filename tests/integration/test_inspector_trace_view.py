"""The inspector reads as a trace viewer, in a real browser (headless Chromium, as
tests/integration/test_inspector_browser.py drives it; skipped, saying why, where there is none):

- On each order store (DynamoDB; PostgreSQL with the polling publisher; PostgreSQL with the logical
  relay), an order placed, read, cancelled and read again is one tree per saga: each publication of an
  event under the API request whose trace its envelope carries, each consumer under the publication of
  its event, the SNS publication under its consumer; the GETs stand alone. An event a consumer ignored
  says "ignored", not ok.
- Its waterfall never overlaps itself at any width from 1920 px down to 640 px: no text leaves its cell,
  no word is broken across lines, and whatever is cut has its whole value on hover (title).
- A consumer that fails shows its error on its hop; its dead-letter queue card shows the message's
  receive count and last error; only queues holding messages have a redrive button; the consumer
  dead-letter queue's redrive (python -m operations redrive-dlq) moves the message back, and the
  consumer then handles it.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from shop.domain.inventory import INVENTORY_RESERVED
from tests.local_stacks import start_stack, stop_stack
from tools.docs.inspector_screenshot import order_with_gets_and_a_cancel, place_order
from tools.local.inspector.browser import browser_tests_gate
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import Template

if TYPE_CHECKING:
    from playwright.sync_api import Page

GATE, WHY = browser_tests_gate()
pytestmark = pytest.mark.skipif(GATE != "run", reason=str(WHY))  # CI without Chromium: the other file fails

SAGA_MS = 30_000  # a bound on waiting, not a speed target
COMMAND_MS = 60_000
WIDTHS = (1920, 1440, 1280, 1024, 800, 640)
PUBLICATIONS = {"dynamodb", "outbox"}
# Each saga's events: those its API request's trace reaches (the cancel's is a trace of its own).
ORDER_SAGA = {"OrderCreated", "InventoryReserved", "OrderConfirmed"}
CANCEL_SAGA = {"OrderCancelled", "InventoryReleased"}


def hop_rows(page: Page) -> list[dict[str, Any]]:
    """The waterfall's rows as the page describes them (its data attributes and texts)."""
    rows: list[dict[str, Any]] = page.eval_on_selector_all(
        '[data-testid="hop-row"]',
        """rows => rows.map(r => ({
            id: r.dataset.hopId, parent: r.dataset.parent, relation: r.dataset.relation,
            depth: Number(r.dataset.depth), function: r.dataset.function, trigger: r.dataset.trigger,
            eventType: r.dataset.eventType, eventId: r.dataset.eventId, outcome: r.dataset.outcome,
            what: r.querySelector('[data-testid="hop-what"]').title,
            result: (r.querySelector('[data-testid="hop-result"]') || {}).title || null,
            error: (r.querySelector('[data-testid="hop-error"]') || {}).title || null,
        }))""",
    )
    return rows


def stray_answer(stack: LocalStack, order_id: str) -> str:
    """An InventoryReserved for the order sent straight to the order-status queue, as EventBridge
    delivers it: the inventory's answer arriving after the order was cancelled. Its event id."""
    event_id = str(uuid.uuid4())
    detail = {
        "specversion": "1.0",
        "id": event_id,
        "source": "shop.inventory",
        "type": INVENTORY_RESERVED,
        "subject": order_id,
        "time": "2026-11-21T12:00:00.000Z",
        "datacontenttype": "application/json",
        "sequence": 1,
        "correlationid": f"corr-late-{order_id}",
        "data": {"orderId": order_id},
    }
    body = {
        "id": str(uuid.uuid4()),
        "detail-type": INVENTORY_RESERVED,
        "source": "shop.inventory",
        "detail": detail,
    }
    stack.clients.sqs().send_message(
        QueueUrl=stack.queue_url("OrderStatusQueue"), MessageBody=json.dumps(body)
    )
    return event_id


# --- one tree per saga, on each store -------------------------------------------------------------------
def test_each_saga_is_one_tree_and_an_ignored_event_says_so(saga_stack: LocalStack, page: Page) -> None:
    from playwright.sync_api import expect

    order_id = order_with_gets_and_a_cancel(saga_stack)
    late = stray_answer(saga_stack, order_id)
    page.goto(f"{saga_stack.inspector_url}#/orders/{order_id}")
    expect(page.locator(f'[data-testid="hop-row"][data-event-id="{late}"]')).to_have_attribute(
        "data-outcome", "ignored"
    )
    expect(page.locator('[data-testid="hop-row"][data-trigger="sns"]')).to_have_count(2)
    page.uncheck("#live")
    rows = hop_rows(page)
    by_id = {row["id"]: row for row in rows}

    def root(row: dict[str, Any]) -> dict[str, Any]:
        while row["parent"] in by_id:
            row = by_id[row["parent"]]
        return row

    apis = [row for row in rows if row["trigger"] == "api"]
    [placed] = [row for row in apis if row["what"].startswith("POST /orders ")]
    [cancel] = [row for row in apis if row["what"].startswith("POST ") and "/cancel" in row["what"]]
    gets = [row for row in apis if row["what"].startswith("GET ")]
    assert len(gets) == 2
    assert all(row["depth"] == 0 and row["parent"] == "" for row in apis)
    assert not any(row["parent"] == get["id"] for get in gets for row in rows)

    publications = {row["eventId"]: row for row in rows if row["trigger"] in PUBLICATIONS}
    for row in publications.values():  # under the request whose trace the event carries
        writer = placed if row["eventType"] in ORDER_SAGA else cancel
        assert (row["parent"], row["relation"], row["depth"]) == (writer["id"], "child", 1), row
    assert {row["eventType"] for row in publications.values()} == ORDER_SAGA | CANCEL_SAGA

    consumers = [row for row in rows if row["trigger"] == "sqs" and row["eventId"] != late]
    assert len(consumers) == 5  # inventory, order status, notification; inventory, notification
    for row in consumers:  # under the publication that put their message on the bus
        assert (row["parent"], row["relation"], row["depth"]) == (
            publications[row["eventId"]]["id"],
            "linked",
            2,
        )
    for row in (r for r in rows if r["trigger"] == "sns"):
        parent = by_id[row["parent"]]
        assert (parent["function"], parent["eventId"], row["depth"]) == (
            "NotificationFunction",
            row["eventId"],
            3,
        )

    # One tree per saga: every hop of the order's saga under its POST, every hop of the cancel's under it.
    saga = {row["eventType"] for row in rows if root(row) is placed and row is not placed}
    cancelled = {row["eventType"] for row in rows if root(row) is cancel and row is not cancel}
    assert (saga, cancelled) == (ORDER_SAGA, CANCEL_SAGA)
    assert [row["outcome"] for row in rows if row["eventId"] != late] == ["ok"] * (len(rows) - 1)

    [ignored] = [row for row in rows if row["eventId"] == late]
    assert (ignored["function"], ignored["result"]) == ("OrderStatusFunction", "→ ignored: order CANCELLED")
    expect(page.locator(f'[data-event-id="{late}"] [data-testid="hop-outcome"]')).to_have_text("ignored")


# --- no overlapping text, at any width ------------------------------------------------------------------
# For every cell of the waterfall: the cells of a row do not overlap; each text's visible part (its own
# box, or the box of the element that clips it) stays inside its cell; no word is broken across lines;
# text cut by its box, or an id shortened with "…", has its whole value in a title around it.
LAYOUT_PROBLEMS = """
() => {
  const problems = [];
  let texts = 0;
  const inside = (r, box) => r.left >= box.left - 0.5 && r.right <= box.right + 0.5
    && r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5;
  const overlap = (a, b) => Math.max(0, Math.min(a.right, b.right) - Math.max(a.left, b.left))
    * Math.max(0, Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top));
  for (const [r, row] of [...document.querySelectorAll('[data-testid="timeline"] tr')].entries()) {
    const cells = [...row.children];
    const boxes = cells.map((cell) => cell.getBoundingClientRect());
    for (let i = 0; i < cells.length; i++) for (let j = i + 1; j < cells.length; j++)
      if (overlap(boxes[i], boxes[j]) > 1) problems.push(`row ${r}: cells ${i} and ${j} overlap`);
    cells.forEach((cell, i) => {
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const text = node.textContent;
        if (!text.trim()) continue;
        texts++;
        let clip = null, titled = null;
        for (let el = node.parentElement; el && el !== row; el = el.parentElement) {
          if (!clip && getComputedStyle(el).overflowX !== "visible") clip = el;
          if (!titled && el.title) titled = el;
        }
        const range = document.createRange();
        range.selectNodeContents(node);
        const shown = clip ? [clip.getBoundingClientRect()] : [...range.getClientRects()];
        if (!shown.every((box) => inside(box, boxes[i])))
          problems.push(`row ${r} cell ${i}: "${text}" leaves its cell`);
        const cut = clip && clip.scrollWidth > clip.clientWidth + 1;
        if ((cut || text.includes("…")) && !(titled && titled.title.length >= text.replace("…", "").length))
          problems.push(`row ${r} cell ${i}: "${text}" is cut with no title holding it whole`);
        let at = 0;
        for (const word of text.split(/\\s+/)) {
          const start = text.indexOf(word, at);
          at = start + word.length;
          if (!word) continue;
          const part = document.createRange();
          part.setStart(node, start);
          part.setEnd(node, at);
          const lines = new Set([...part.getClientRects()].map((box) => Math.round(box.top)));
          if (lines.size > 1) problems.push(`row ${r} cell ${i}: the word "${word}" is broken across lines`);
        }
      }
    });
  }
  return { problems, texts };
}
"""


def test_the_waterfall_never_overlaps_itself_at_any_width(local_stack: LocalStack, page: Page) -> None:
    from playwright.sync_api import expect

    order_id = order_with_gets_and_a_cancel(local_stack)
    page.goto(f"{local_stack.inspector_url}#/orders/{order_id}")
    expect(page.locator('[data-testid="hop-row"][data-trigger="sns"]')).to_have_count(2)
    page.uncheck("#live")
    rows = page.locator('[data-testid="hop-row"]').count()

    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        found = page.evaluate(LAYOUT_PROBLEMS)
        assert found["problems"] == [], f"at {width} px"
        assert found["texts"] >= rows * 8, f"at {width} px: only {found['texts']} texts checked"
    # The long ids are shortened, whole on hover: the cancel's path names the order.
    cancel = page.locator('[data-testid="hop-what"]', has_text="/cancel")
    expect(cancel).to_have_attribute("title", f"POST /orders/{order_id}/cancel 200")
    expect(cancel).to_have_text(f"POST /orders/{order_id[:8]}…/cancel 200")


# --- a failing consumer, its dead-letter queue, and the redrive back -----------------------------------
@pytest.fixture(scope="module")
def failing_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """A stack of its own whose notification queue dead-letters a message after 2 receives, 1 s apart."""
    template = Template.load(parameters={"ConsumerMaxReceiveCount": "2"}, stack_name="dlq")
    data = copy.deepcopy(template.data)
    data["Resources"]["NotificationQueue"]["Properties"]["VisibilityTimeout"] = 1
    options = StackOptions(api_port=0, data_dir=tmp_path_factory.mktemp("dlq-stack"))
    stack = start_stack(
        Template(data, parameters={"ConsumerMaxReceiveCount": "2"}, stack_name="dlq"), options, local_services
    )
    yield stack
    stop_stack(stack)


def test_a_failing_consumer_shows_its_error_and_its_dead_letter_queue_redrives_from_the_page(
    failing_stack: LocalStack, page: Page
) -> None:
    from playwright.sync_api import expect

    stack = failing_stack
    sns = stack.clients.sns()
    topic = stack.template.arn("NotificationTopic")
    sns.delete_topic(TopicArn=topic)  # the notification consumer's Publish now fails: NotFound
    order_id = place_order(stack)

    page.goto(f"{stack.inspector_url}#/queues")
    card = page.locator('[data-testid="queue-card"][data-queue="NotificationDeadLetterQueue"]')
    expect(card.get_by_test_id("queue-visible")).to_have_text("1")
    message = card.get_by_test_id("queue-message")
    expect(message).to_have_count(1)
    expect(message.get_by_test_id("message-received")).to_contain_text("received 2 time(s)")
    expect(message.get_by_test_id("message-last-error")).to_contain_text("last error: NotFoundException")
    # A button only on the queue that holds something to redrive.
    expect(page.locator('[data-testid="queue-card"] button.primary')).to_have_count(1)
    expect(card.get_by_test_id("action-redrive-dlq")).to_have_text("Redrive to NotificationQueue")

    sns.create_topic(Name=stack.template.physical_name("NotificationTopic"))  # the cause fixed
    # The template's visibility timeout back (6 x the consumer's timeout): at the fixture's 1 s, a handled
    # delivery that runs longer than a second is received again, as SQS would do on AWS.
    visibility = Template.load().properties("NotificationQueue")["VisibilityTimeout"]
    stack.clients.sqs().set_queue_attributes(
        QueueUrl=stack.queue_url("NotificationQueue"), Attributes={"VisibilityTimeout": str(visibility)}
    )
    provisioned = stack.report.provisioning
    for watcher in (provisioned.capture_queues, provisioned.console_queues):  # the stack's own subscriptions
        arn = stack.clients.sqs().get_queue_attributes(
            QueueUrl=watcher["NotificationTopic"], AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    card.get_by_test_id("action-redrive-dlq").click()
    expect(page.get_by_test_id("confirm-dialog")).to_contain_text("python -m operations redrive-dlq")
    page.get_by_test_id("confirm-yes").click()

    report = page.get_by_test_id("action-report")
    expect(report).to_have_attribute("data-state", "complete", timeout=COMMAND_MS)
    expect(report.get_by_test_id("action-message")).to_have_text(
        "redrive-dlq: 1 message(s) moved from NotificationDeadLetterQueue back to its queue."
    )
    expect(report).to_contain_text("python -m operations redrive-dlq --max-messages 1000 --queue-url")
    expect(card.get_by_test_id("queue-visible")).to_have_text("0")
    expect(page.locator('[data-testid="queue-card"] button.primary')).to_have_count(0)

    # The order's timeline: the two failed deliveries with their error, then the redriven one handled.
    page.goto(f"{stack.inspector_url}#/orders/{order_id}")
    notifications = page.locator('[data-testid="hop-row"][data-function="NotificationFunction"]')
    expect(notifications).to_have_count(3)
    expect(page.locator('[data-testid="hop-row"][data-trigger="sns"]')).to_have_count(1)
    page.uncheck("#live")
    handled = [(r["outcome"], r["error"]) for r in hop_rows(page) if r["function"] == "NotificationFunction"]
    assert [outcome for outcome, _ in handled] == ["failed", "failed", "ok"]
    assert all(error is not None and error.startswith("NotFoundException: ") for _, error in handled[:2])
    assert handled[2][1] is None
    # The redriven message kept its trace header: it still hangs under the publication of its event.
    publication = next(
        r for r in hop_rows(page) if r["trigger"] == "dynamodb" and r["eventType"] == "OrderConfirmed"
    )
    assert {r["parent"] for r in hop_rows(page) if r["function"] == "NotificationFunction"} == {
        publication["id"]
    }
