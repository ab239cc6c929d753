"""Headless Chromium for the inspector's browser tests and make docs' screenshot: the OS's own Chromium
(`make browser`: Debian's chromium package at /usr/bin/chromium, or CHROMIUM=<path>), driven by
Playwright. Playwright's own browser download is never used (this machine reaches no CDN).

The flags keep Chromium off the network it would otherwise call at start (component updates, sync,
field trials, QUIC probes): on a closed network those calls are refused and slow every start.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

CHROMIUM_VARIABLE = "CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
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


def chromium_path() -> Path:
    return Path(os.environ.get(CHROMIUM_VARIABLE) or DEFAULT_CHROMIUM)


def missing_chromium() -> str | None:
    """Why the browser cannot run here, or None when it can."""
    path = chromium_path()
    if path.is_file() and os.access(path, os.X_OK):
        return None
    return (
        f"no Chromium at {path} ({CHROMIUM_VARIABLE}): `make browser` installs it "
        "(Debian: apt-get install chromium, as root)"
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
