"""Stacks of a test's own with a console to read back (tests/integration/test_poison_corpus.py,
test_console_lines.py): what `make local` prints, in a buffer, written as strictly as a terminal's stream."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.local_stacks import created_order, stop_stack
from tools.local.console.render import Console
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack, StackOptions
from tools.template import Template


@dataclass
class WatchedStack:
    """A stack of its own with a console writing UTF-8 strictly, as a terminal's stream does."""

    stack: LocalStack
    console: Console
    output: io.BytesIO

    def printed(self) -> str:
        self.console.flush(5.0)
        return self.output.getvalue().decode("utf-8")


@contextlib.contextmanager
def watched_stack(services: LocalServices, data_dir: Path, template: Template) -> Iterator[WatchedStack]:
    output = io.BytesIO()
    console = Console(io.TextIOWrapper(output, encoding="utf-8", write_through=True), color=False)
    options = StackOptions(api_port=0, data_dir=data_dir)
    stack = LocalStack(template, options, services=services, console=console)
    stack.start()
    try:
        assert not stack.report.init_errors, f"functions failed to start: {stack.report.init_errors}"
        yield WatchedStack(stack, console, output)
    finally:
        stop_stack(stack)


def place_order(stack: LocalStack) -> str:
    order = created_order(stack, "c-poison", [{"sku": "SKU-RED-MUG", "quantity": 1, "unitPrice": 100}])
    return str(order["orderId"])


def statuses(stack: LocalStack, order_ids: list[str]) -> dict[str, str]:
    return {
        order: requests.get(f"{stack.api_url}/orders/{order}", timeout=10).json()["status"]
        for order in order_ids
    }
