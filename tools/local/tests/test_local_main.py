"""`make local` stops with exit status 1, saying why, when a thread of the stack has died for good: a
supervised thread that failed too often, or any other thread (tools/local/__main__.py)."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any, cast

import pytest

import tools.local.__main__ as local_main
from tools.local.console.render import Console
from tools.local.supervision import ThreadHealth


class Services:
    def alive(self) -> bool:
        return True


class Options:
    log_dir = Path("stack/logs")  # never written: the reason names it


class FakeStack:
    """What _serve watches of a running stack: its services, its supervised threads, where its logs are."""

    def __init__(self, failed: list[ThreadHealth]) -> None:
        self.services = Services()
        self.options = Options()
        self._failed = failed

    def failed_threads(self) -> list[ThreadHealth]:
        return self._failed


@pytest.fixture(autouse=True)
def no_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_main, "startup_summary", lambda *_: [])
    monkeypatch.setattr(local_main, "write_state", lambda *_: None)


def serve(stack: FakeStack, dead_threads: list[str]) -> tuple[int, str]:
    output = io.StringIO()
    console = Console(output, color=False)
    code = local_main._serve(cast(Any, stack), console, None, Path("stack.json"), dead_threads)
    return code, output.getvalue()


def test_a_thread_that_failed_too_often_stops_the_stack_with_status_1() -> None:
    failed = ThreadHealth("stream-OutboxRelayFunction.OrdersOutbox", False, 5, "KeyError: 'dynamodb'")

    code, printed = serve(FakeStack([failed]), [])

    assert code == 1
    assert (
        "error: thread stream-OutboxRelayFunction.OrdersOutbox failed too often to be restarted "
        "(last: KeyError: 'dynamodb'): the stack stops"
    ) in printed


def test_any_other_thread_that_dies_is_printed_at_once_and_stops_the_stack_with_status_1() -> None:
    output = io.StringIO()
    hook = local_main._DeadThreads(Console(output, color=False))
    previous, threading.excepthook = threading.excepthook, hook
    try:
        sockets: dict[str, int] = {}
        api = threading.Thread(target=lambda: sockets["socket"], name="api")
        api.start()
        api.join()
    finally:
        threading.excepthook = previous

    assert "error: thread api died: KeyError: 'socket'" in output.getvalue()
    code, printed = serve(FakeStack([]), hook.died)
    assert code == 1
    assert "error: thread api died: KeyError: 'socket': the stack stops" in printed
