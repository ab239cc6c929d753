"""The inspector's JSON API (inspector/api.py) over a stack view of canned data, and its place in the
gateway: /_local/ is served by the inspector, is never recorded as activity, and no template route may
take it."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from tools.local.console.activity import ActivityLog, Entry
from tools.local.gateway.server import LOCAL_PREFIX, ApiServer, HttpAnswer, RouteConflict, RouteTable
from tools.local.inspector.api import InspectorApi
from tools.local.inspector.stack_view import QueueState, message_summary
from tools.local.operator_commands import CommandRun
from tools.local.pollers.event_sources import ApiRoute
from tools.local.tests.command_reports import POISON_REPORT, POWERTOOLS_LINE
from tools.local.tests.saga_entries import confirmed_saga

ORDERS = [
    {"orderId": "o-3", "customerId": "c-2002", "status": "PENDING", "createdAt": "2026-11-21T12:00:03.000Z"},
    {"orderId": "o-2", "customerId": "c-1001", "status": "REJECTED", "createdAt": "2026-11-21T12:00:02.000Z"},
    {
        "orderId": "o-1",
        "customerId": "c-1001",
        "status": "CONFIRMED",
        "createdAt": "2026-11-21T12:00:01.000Z",
    },
]


def command_run(exit_code: int, *lines: dict[str, Any], stderr: str = "") -> CommandRun:
    stdout = "\n".join(json.dumps(line) for line in lines)
    argv = ["/venv/bin/python", "-m", "operations", "redrive-poison"]
    return CommandRun(argv, exit_code, stdout, stderr, 1.5)


@dataclass
class FakeView:
    runs: dict[str, CommandRun] = field(default_factory=dict)
    entries_: list[Entry] = field(default_factory=list)
    store: str = "dynamodb"
    order_store_name: str = "local-OrdersTable"
    ran: list[str] = field(default_factory=list)

    def entries(self) -> list[Entry]:
        return self.entries_

    def orders(self) -> list[dict[str, Any]]:
        return ORDERS

    def order(self, order_id: str) -> dict[str, Any] | None:
        return next((o for o in ORDERS if o["orderId"] == order_id), None)

    def outbox_rows(self, order_id: str) -> list[dict[str, Any]]:
        return []

    def queues(self, with_messages: bool = True) -> list[QueueState]:
        body = {"kind": "outbox-poison", "eventId": "e-1", "reason": "EventBridge rejected the entry"}
        messages = (
            [{"messageId": "m-1", "summary": message_summary(body), "body": body}] if with_messages else []
        )
        return [
            QueueState(
                "RelayPoisonQueue",
                "relay poison queue",
                1,
                0,
                0,
                action="redrive-poison",
                peeked=True,
                messages=messages,
            ),
            QueueState("InventoryQueue", "consumer queue", 3, 1, 0, consumer="InventoryFunction"),
        ]

    def parked_event_ids(self) -> frozenset[str]:
        return frozenset()

    def run_recovery(self, action: str) -> CommandRun:
        self.ran.append(action)
        return self.runs[action]


def call(
    api: InspectorApi, method: str, target: str, *, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    answer = api.handle(method, target, list((headers or {}).items()), b"{}")
    assert ("Content-Type", "application/json") in answer.headers
    return answer.status, json.loads(answer.body)


ACTION_QUEUES = {"redrive": "RelayDeadLetterQueue", "redrive-poison": "RelayPoisonQueue"}


def inspector(view: FakeView) -> InspectorApi:
    return InspectorApi(view, ACTION_QUEUES)


JSON_POST = {"Content-Type": "application/json", "Host": "127.0.0.1:3000", "Origin": "http://127.0.0.1:3000"}


def test_orders_newest_first_filtered_by_status_and_customer() -> None:
    api = inspector(FakeView())

    _, every = call(api, "GET", "/_local/api/orders")
    _, confirmed = call(api, "GET", "/_local/api/orders?status=confirmed")
    _, customer = call(api, "GET", "/_local/api/orders?customer=C-10&limit=1")

    assert [o["orderId"] for o in every["orders"]] == ["o-3", "o-2", "o-1"]
    assert [o["orderId"] for o in confirmed["orders"]] == ["o-1"]
    assert ([o["orderId"] for o in customer["orders"]], customer["matching"], customer["total"]) == (
        ["o-2"],
        2,
        3,
    )


@pytest.mark.parametrize(
    ("query", "code"),
    [("status=SHIPPED", "invalid_status"), ("limit=0", "invalid_limit"), ("limit=ten", "invalid_limit")],
)
def test_a_bad_filter_is_a_400_naming_what_is_allowed(query: str, code: str) -> None:
    status, document = call(inspector(FakeView()), "GET", f"/_local/api/orders?{query}")

    assert (status, document["error"]["code"]) == (400, code)


def test_an_order_comes_with_its_timeline() -> None:
    view = FakeView(entries_=confirmed_saga("o-1", "corr-1") + confirmed_saga("o-2", "corr-2"))

    status, document = call(inspector(view), "GET", "/_local/api/orders/o-1")

    assert status == 200
    assert document["order"]["status"] == "CONFIRMED"
    assert [(h["function"], h["eventType"]) for h in document["hops"]][:3] == [
        ("OrdersApiFunction", None),
        ("OutboxRelayFunction", "OrderCreated"),
        ("InventoryFunction", "OrderCreated"),
    ]
    assert len(document["hops"]) == 8
    assert document["note"] is None


def test_an_order_with_no_recorded_hop_says_why() -> None:
    _, document = call(inspector(FakeView()), "GET", "/_local/api/orders/o-3")

    assert document["hops"] == []
    assert "PERSIST=1" in document["note"]


def test_an_unknown_order_is_a_404_with_a_stable_code_and_the_store_it_was_looked_for_in() -> None:
    status, document = call(inspector(FakeView()), "GET", "/_local/api/orders/o-nope")

    assert status == 404
    assert document["error"] == {
        "code": "order_not_found",
        "message": "no order 'o-nope' in local-OrdersTable",
    }


def test_queues_show_counts_and_the_parked_messages() -> None:
    _, document = call(inspector(FakeView()), "GET", "/_local/api/queues")
    _, counts_only = call(inspector(FakeView()), "GET", "/_local/api/queues?messages=0")

    poison, inventory = document["queues"]
    assert (poison["action"], poison["visible"], poison["peeked"]) == ("redrive-poison", 1, True)
    assert poison["messages"][0]["summary"]["reason"] == "EventBridge rejected the entry"
    assert (inventory["peeked"], inventory["messages"], inventory["inFlight"]) == (False, [], 1)
    assert counts_only["queues"][0]["messages"] == []


def test_a_redrive_answers_the_commands_own_report() -> None:
    summary = {"redriven": 1, "kept": 0, "parked": []}
    view = FakeView(runs={"redrive-poison": command_run(0, POWERTOOLS_LINE, POISON_REPORT, summary)})

    status, document = call(inspector(view), "POST", "/_local/api/actions/redrive-poison", headers=JSON_POST)

    assert status == 200
    assert view.ran == ["redrive-poison"]
    assert (document["complete"], document["summary"], document["messages"]) == (
        True,
        summary,
        [POISON_REPORT],
    )
    assert document["command"] == "python -m operations redrive-poison"
    assert document["message"] == (
        "redrive-poison: 1 message(s) redriven from RelayPoisonQueue; every event is on the bus."
    )


def test_a_redrive_that_kept_a_message_is_reported_incomplete_with_what_is_missing() -> None:
    kept = {**POISON_REPORT, "published": 0, "complete": False, "missing": ["EventBridge still rejects it"]}
    view = FakeView(runs={"redrive-poison": command_run(1, kept, {"redriven": 0, "kept": 1, "parked": []})})

    status, document = call(inspector(view), "POST", "/_local/api/actions/redrive-poison", headers=JSON_POST)

    assert (status, document["complete"]) == (200, False)
    assert document["messages"][0]["missing"] == ["EventBridge still rejects it"]
    assert "1 kept there" in document["message"]
    assert document["message"].endswith("not everything is on the bus.")


def test_a_redrive_with_nothing_parked_is_a_409_that_says_so() -> None:
    view = FakeView(runs={"redrive-poison": command_run(0, {"redriven": 0, "kept": 0, "parked": []})})

    status, document = call(inspector(view), "POST", "/_local/api/actions/redrive-poison", headers=JSON_POST)

    assert status == 409
    assert document["error"]["code"] == "nothing_to_redrive"
    assert "holds no message" in document["error"]["message"]
    assert document["report"]["exitCode"] == 0


def test_a_command_that_ends_without_its_report_is_a_500_with_its_output() -> None:
    view = FakeView(runs={"redrive": command_run(2, stderr="Traceback ...\nKeyError: 'Messages'")})

    status, document = call(inspector(view), "POST", "/_local/api/actions/redrive", headers=JSON_POST)

    assert status == 500
    assert document["error"]["code"] == "command_failed"
    assert "KeyError: 'Messages'" in document["error"]["message"]


def test_a_second_redrive_while_one_runs_is_refused() -> None:
    started, release = threading.Event(), threading.Event()

    class SlowView(FakeView):
        def run_recovery(self, action: str) -> CommandRun:
            started.set()
            release.wait(5)
            return command_run(0, {"redriven": 1, "kept": 0, "parked": []})

    api = inspector(SlowView())
    first = threading.Thread(
        target=call, args=(api, "POST", "/_local/api/actions/redrive"), kwargs={"headers": JSON_POST}
    )
    first.start()
    started.wait(5)
    try:
        status, document = call(api, "POST", "/_local/api/actions/redrive-poison", headers=JSON_POST)
    finally:
        release.set()
        first.join(5)

    assert (status, document["error"]["code"]) == (409, "action_running")


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        ({**JSON_POST, "Origin": "https://elsewhere.example"}, 403, "forbidden_origin"),
    ],
)
def test_an_action_is_taken_only_from_the_pages_own_json_request(
    headers: dict[str, str], status: int, code: str
) -> None:
    view = FakeView()

    answer = call(inspector(view), "POST", "/_local/api/actions/redrive-poison", headers=headers)

    assert (answer[0], answer[1]["error"]["code"]) == (status, code)
    assert view.ran == []


@pytest.mark.parametrize(
    ("method", "target", "status", "code"),
    [
        ("GET", "/_local/api/nothing", 404, "not_found"),
        ("POST", "/_local/api/actions/replay", 404, "not_found"),
        ("DELETE", "/_local/api/orders/o-1", 405, "method_not_allowed"),
        ("GET", "/_local/api/actions/redrive", 405, "method_not_allowed"),
        ("GET", "/_local/static/../api.py", 404, "not_found"),
        ("GET", "/_local/static/missing.js", 404, "not_found"),
    ],
)
def test_every_error_is_json_with_a_stable_code(method: str, target: str, status: int, code: str) -> None:
    answer = call(inspector(FakeView()), method, target, headers=JSON_POST)

    assert (answer[0], answer[1]["error"]["code"]) == (status, code)


def test_a_failure_inside_the_inspector_is_a_json_500_naming_it() -> None:
    class Broken(FakeView):
        def orders(self) -> list[dict[str, Any]]:
            raise ConnectionError("DynamoDB Local is gone")

    status, document = call(inspector(Broken()), "GET", "/_local/api/orders")

    assert status == 500
    assert document["error"]["code"] == "inspector_failed"
    assert "DynamoDB Local is gone" in document["error"]["message"]


def test_the_page_and_its_files_are_served_locally_with_no_other_origin() -> None:
    api = inspector(FakeView())

    page = api.handle("GET", "/_local/", [], b"")
    script = api.handle("GET", "/_local/static/inspector.js", [], b"")
    redirect = api.handle("GET", "/_local", [], b"")

    assert (page.status, dict(page.headers)["Content-Type"]) == (200, "text/html; charset=utf-8")
    assert b"/_local/static/inspector.js" in page.body
    assert b"http" not in page.body  # no CDN: every file comes from /_local/
    assert (script.status, b"/_local/api" in script.body) == (200, True)
    assert (redirect.status, dict(redirect.headers)["Location"]) == (308, "/_local/")


class FixedPages:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    def handle(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> HttpAnswer:
        self.requests.append((method, target))
        return HttpAnswer(200, [("Content-Type", "application/json")], b"{}")


def test_the_gateway_hands_local_paths_to_the_inspector_and_records_no_activity() -> None:
    pages, activity = FixedPages(), ActivityLog()
    server = ApiServer(RouteTable([], {}), {}, {}, activity, 0, {LOCAL_PREFIX: pages})
    try:
        inspector = server.handle("GET", "/_local/api/orders?status=PENDING", [], b"", "127.0.0.1")
        lookalike = server.handle("GET", "/_localish", [], b"", "127.0.0.1")
    finally:
        server.stop()

    assert inspector.status == 200
    assert pages.requests == [("GET", "/_local/api/orders?status=PENDING")]
    assert lookalike.status == 403  # not under /_local/: API Gateway's answer to an unknown route
    assert activity.entries() == []


def test_a_template_route_under_the_inspectors_prefix_is_refused() -> None:
    route = ApiRoute(
        function="OrdersApiFunction", name="Local", api="ServerlessRestApi", path="/_local/x", method="GET"
    )

    with pytest.raises(RouteConflict, match="/_local"):
        RouteTable([route], {})


def test_a_stack_whose_template_names_no_relay_queues_has_no_redrive_and_says_why() -> None:
    view = FakeView()

    status, document = call(InspectorApi(view, {}), "POST", "/_local/api/actions/redrive", headers=JSON_POST)

    assert (status, document["error"]["code"]) == (404, "not_found")
    assert "no RelayDeadLetterQueueUrl output" in document["error"]["message"]
    assert view.ran == []
