"""The docker-free local stack for the integration tests, started once per session on free ports.

Its fixtures (`local_services`, `local_stack`, `probe_stack`) are defined in tests/conftest.py, so
tests/conformance shares the same ones in a session that runs both; the helpers (tests/local_stacks.py)
stay importable from here.

The inspector's browser tests (test_inspector_*.py) share `browser`, one headless Chromium a module, and
`page`, a fresh page on it whose assertions wait up to the module's SAGA_MS.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.local_stacks import (
    PROBE_FRAGMENT,
    PROBE_FUNCTIONS,
    assert_processes_gone,
    probe_template_data,
    start_stack,
    stop_stack,
)
from tools.local.inspector.browser import browser_tests_gate, headless_chromium

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page

__all__ = [
    "PROBE_FRAGMENT",
    "PROBE_FUNCTIONS",
    "assert_processes_gone",
    "probe_template_data",
    "start_stack",
    "stop_stack",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserContext]:
    if browser_tests_gate()[0] == "fail":  # CI without Chromium: one test fails for all of them, once
        pytest.skip("no Chromium, and CI is set: test_ci_has_the_chromium_the_browser_tests_need says why")
    with headless_chromium() as context:
        yield context


@pytest.fixture
def page(browser: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    from playwright.sync_api import expect

    expect.set_options(timeout=request.module.SAGA_MS)
    opened = browser.new_page()
    yield opened
    opened.close()
