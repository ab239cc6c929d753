"""GET /_local/api/health: the stack's supervised threads, in the contract the page's banner reads."""

from __future__ import annotations

import json
from typing import Any, cast

from tools.local.inspector.api import InspectorApi
from tools.local.supervision import ThreadHealth

THREADS = [
    ThreadHealth("stream-OutboxRelayFunction.OrdersOutbox", True, 2, "ValueError: Exceeds the limit"),
    ThreadHealth("console", False, 5, "OSError: EIO"),
    ThreadHealth("sqs-InventoryFunction.InventoryMessages", True, 0, None),
]


def call(api: InspectorApi, method: str) -> tuple[int, dict[str, Any]]:
    answer = api.handle(method, "/_local/api/health", [], b"")
    return answer.status, json.loads(answer.body)


def test_each_thread_with_whether_it_runs_its_restarts_and_its_last_error() -> None:
    api = InspectorApi(cast(Any, None), {}, lambda: THREADS)

    status, document = call(api, "GET")

    assert status == 200
    assert document == {
        "threads": [
            {
                "name": "stream-OutboxRelayFunction.OrdersOutbox",
                "alive": True,
                "restarts": 2,
                "error": "ValueError: Exceeds the limit",
            },
            {"name": "console", "alive": False, "restarts": 5, "error": "OSError: EIO"},
            {"name": "sqs-InventoryFunction.InventoryMessages", "alive": True, "restarts": 0, "error": None},
        ]
    }


def test_it_is_read_only_and_empty_without_a_stack() -> None:
    assert call(InspectorApi(cast(Any, None), {}, lambda: THREADS), "POST")[0] == 405
    assert call(InspectorApi(cast(Any, None), {}), "GET") == (200, {"threads": []})
