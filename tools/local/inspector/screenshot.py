"""`python -m tools.local.inspector.screenshot [PATH]` (make docs): a screenshot of one order's timeline
in the inspector, from a local stack of its own, in headless Chromium (browser.py). PATH defaults to
docs/images/inspector.png.

One order is placed first and waited for, so the one shown is warm (the first order of a stack pays
every function's cold start, as in Lambda); the second is shown once its notification is published.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

from tools.local.inspector.browser import VIEWPORT, headless_chromium, missing_chromium
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


def place_order(stack: LocalStack) -> str:
    request = urllib.request.Request(  # noqa: S310 - an http:// URL of the local API
        f"{stack.api_url}/orders",
        data=json.dumps(_ORDER).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": str(uuid.uuid4())},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - the same URL
        order_id = json.loads(response.read())["orderId"]
    return str(order_id)


def notified(stack: LocalStack, order_id: str) -> None:
    def published() -> bool:
        return any(f'"orderId":"{order_id}"' in p.message for p in stack.activity.publications())

    stack.wait_for(published, SAGA_SECONDS, f"the notification of order {order_id}")


def take(path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="inspector-shot-") as data_dir:
        stack = LocalStack(Template.load(), StackOptions(api_port=0, data_dir=Path(data_dir)))
        stack.start()
        try:
            notified(stack, place_order(stack))  # warms every function up
            order_id = place_order(stack)
            notified(stack, order_id)
            with headless_chromium() as browser:
                page = browser.new_page()
                page.goto(f"{stack.inspector_url}#/orders/{order_id}")
                page.locator('[data-testid="hop-row"][data-trigger="sns"]').wait_for()  # the last hop
                page.uncheck("#live")  # the picture of one moment, not a refresh in progress
                page.set_viewport_size(
                    {"width": VIEWPORT["width"], "height": 200}
                )  # full_page: just the content
                path.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(path), full_page=True)
        finally:
            stack.stop()


def main(argv: list[str]) -> int:
    reason = missing_chromium()
    if reason is not None:
        print(f"error: cannot take the inspector's screenshot: {reason}", file=sys.stderr)
        return 1
    path = Path(argv[0]) if argv else DEFAULT_PATH
    take(path)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
