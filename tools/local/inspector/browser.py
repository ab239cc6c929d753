"""Headless Chromium for the inspector's browser tests and make docs' screenshot: the OS's own Chromium
(`make browser`: Debian's chromium package at /usr/bin/chromium, or CHROMIUM=<path>), driven by
Playwright. Playwright's own browser download is never used (this machine reaches no CDN).

The flags keep Chromium off the network it would otherwise call at start (component updates, sync,
field trials, QUIC probes): on a closed network those calls are refused and slow every start.

Where there is no Chromium the browser tests are skipped, saying why; with CI=true they fail instead
(`browser_tests_gate`): a CI run that skipped them would pass a page nobody opened.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

CHROMIUM_VARIABLE = "CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
CI_VARIABLE = "CI"  # set to true by GitHub Actions, GitLab CI and most CI services
CHROMIUM_FLAGS = (
    "--no-sandbox",  # root in a container has no user namespace for Chromium's sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
VIEWPORT = {"width": 1440, "height": 900}


def chromium_path(environ: Mapping[str, str] | None = None) -> Path:
    return Path((os.environ if environ is None else environ).get(CHROMIUM_VARIABLE) or DEFAULT_CHROMIUM)


def missing_chromium(environ: Mapping[str, str] | None = None) -> str | None:
    """Why the browser cannot run here, or None when it can."""
    path = chromium_path(environ)
    if path.is_file() and os.access(path, os.X_OK):
        return None
    return (
        f"no Chromium at {path} ({CHROMIUM_VARIABLE}): `make browser` installs it "
        "(Debian: apt-get install chromium, as root)"
    )


def running_in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """CI=true (or 1, yes): a continuous-integration run, where every test must run."""
    value = (os.environ if environ is None else environ).get(CI_VARIABLE, "")
    return value.strip().lower() in {"true", "1", "yes"}


def browser_tests_gate(environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """What the browser tests do here: ("run", None); ("skip", why) where there is no Chromium; or
    ("fail", why) where there is none and CI is set (tests/integration/test_inspector_browser.py)."""
    reason = missing_chromium(environ)
    if reason is None:
        return "run", None
    if not running_in_ci(environ):
        return "skip", f"browser tests: {reason}"
    value = (os.environ if environ is None else environ).get(CI_VARIABLE)
    return "fail", (
        f"{CI_VARIABLE}={value}: the inspector's browser tests must run in CI, and cannot: {reason}. "
        f"Install Chromium on the CI machine, or set {CHROMIUM_VARIABLE} to one; outside CI they are skipped"
    )


@contextmanager
def headless_chromium() -> Iterator[BrowserContext]:
    """A fresh headless Chromium (its own temporary profile), closed on exit."""
    from playwright.sync_api import sync_playwright

    reason = missing_chromium()
    if reason is not None:
        raise FileNotFoundError(reason)
    with (
        tempfile.TemporaryDirectory(prefix="inspector-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(chromium_path()),
            headless=True,
            args=list(CHROMIUM_FLAGS),
            viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]},
        )
        try:
            yield context
        finally:
            context.close()
