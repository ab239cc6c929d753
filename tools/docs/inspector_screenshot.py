"""`python -m tools.docs.inspector_screenshot [PATH]` (make docs): screenshots of one order's timeline in
the inspector on each order store, from local stacks of their own, in headless Chromium
(tools/local/inspector/browser.py).
PATH (default docs/images/inspector.png) is the DynamoDB stack's; beside it, `<name>-postgres.png`
(OrderStore=postgres, the polling publisher) and `<name>-postgres-logical.png` (PostgresRelay=logical).

The order shown is a newcomer's: placed, read once it is confirmed, cancelled, read again, so its
timeline holds its GETs and the cancel's saga beside the order's own. One order is placed first and
waited for, so the one shown is warm (the first order of a stack pays every function's cold start, as in
Lambda).
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tools.local.inspector.browser import VIEWPORT, headless_chromium, missing_chromium
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import ROOT, Template

DEFAULT_PATH = ROOT / "docs" / "images" / "inspector.png"
SAGA_SECONDS = 60.0
_ORDER = {
    "customerId": "c-1001",
    "currency": "USD",
    "items": [
        {"sku": "SKU-RED-MUG", "quantity": 2, "unitPrice": 1250},
        {"sku": "SKU-BLUE-PEN", "quantity": 3, "unitPrice": 350},
    ],
}


@dataclass(frozen=True)
class Store:
    """One order store of the template: its parameters, its stack's name and its picture's suffix."""

    parameters: dict[str, str]
    stack_name: str
    suffix: str


STORES = (
    Store({}, "local", ""),
    Store({"OrderStore": "postgres"}, "pg", "-postgres"),
    Store({"OrderStore": "postgres", "PostgresRelay": "logical"}, "pgl", "-postgres-logical"),
)


def request(
    stack: LocalStack, method: str, path: str, body: Mapping[str, object] | None = None
) -> dict[str, object]:
    """One call of the stack's API, as a client makes it (a POST with its Idempotency-Key)."""
    sent = urllib.request.Request(  # noqa: S310 - an http:// URL of the local API
        f"{stack.api_url}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())},
        method=method,
    )
    with urllib.request.urlopen(sent, timeout=30) as response:  # noqa: S310 - the same URL
        answer: dict[str, object] = json.loads(response.read())
    return answer


def place_order(stack: LocalStack) -> str:
    return str(request(stack, "POST", "/orders", _ORDER)["orderId"])


def notified(stack: LocalStack, order_id: str, status: str) -> None:
    """Wait for the notification of the order's `status` (CONFIRMED, CANCELLED)."""

    def published() -> bool:
        return any(
            f'"orderId":"{order_id}"' in p.message and f'"status":"{status}"' in p.message
            for p in stack.activity.publications()
        )

    stack.wait_for(published, SAGA_SECONDS, f"the {status} notification of order {order_id}")


def order_with_gets_and_a_cancel(stack: LocalStack) -> str:
    """An order confirmed, read, cancelled and read again, every saga finished; its id."""
    order_id = place_order(stack)
    notified(stack, order_id, "CONFIRMED")
    request(stack, "GET", f"/orders/{order_id}")
    request(stack, "POST", f"/orders/{order_id}/cancel", {})
    notified(stack, order_id, "CANCELLED")
    request(stack, "GET", f"/orders/{order_id}")
    return order_id


def picture(stack: LocalStack, order_id: str, path: Path) -> None:
    with headless_chromium() as browser:
        page = browser.new_page()
        page.goto(f"{stack.inspector_url}#/orders/{order_id}")
        # The last hop: the cancel's notification published.
        page.locator(
            '[data-testid="hop-row"][data-trigger="sns"][data-event-type="OrderCancelled"]'
        ).wait_for()
        page.uncheck("#live")  # the picture of one moment, not a refresh in progress
        page.set_viewport_size({"width": VIEWPORT["width"], "height": 200})  # full_page: just the content
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=True)


def take(path: Path, say: Callable[[str], None] = print) -> list[Path]:
    """The three pictures, each from a stack of its own on one set of services; their paths."""
    written = []
    with tempfile.TemporaryDirectory(prefix="inspector-shot-") as data_dir:
        services = LocalServices(Path(data_dir) / "services")
        services.start()
        try:
            for store in STORES:
                template = Template.load(parameters=store.parameters, stack_name=store.stack_name)
                options = StackOptions(api_port=0, data_dir=Path(data_dir) / store.stack_name)
                stack = LocalStack(template, options, services=services)
                stack.start()
                try:
                    order_with_gets_and_a_cancel(stack)  # warms every function up
                    shown = order_with_gets_and_a_cancel(stack)
                    target = path.with_name(f"{path.stem}{store.suffix}{path.suffix}")
                    picture(stack, shown, target)
                    say(f"wrote {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
                    written.append(target)
                finally:
                    stack.stop()
        finally:
            services.stop()
    return written


def main(argv: list[str]) -> int:
    reason = missing_chromium()
    if reason is not None:
        print(f"error: cannot take the inspector's screenshots: {reason}", file=sys.stderr)
        return 1
    take(Path(argv[0]) if argv else DEFAULT_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
