"""The inspector's HTTP surface under /_local/: the page and its files, and a JSON API.

    GET  /_local/                         the page (static/index.html; its JS and CSS under /_local/static/)
    GET  /_local/api/orders               orders, newest first: ?status=CONFIRMED&customer=c-1&limit=100
    GET  /_local/api/orders/{orderId}     the order and its timeline (hops, in waterfall order)
    GET  /_local/api/queues               every queue's counts, the dead-letter and poison queues' messages
                                          (?messages=0: counts only)
    GET  /_local/api/health               the stack's supervised threads (pollers, topic watchers, console):
                                          {"threads": [{"name", "alive", "restarts", "error"}]}
    POST /_local/api/actions/redrive      python -m operations redrive (the relay dead-letter queue)
    POST /_local/api/actions/redrive-poison   python -m operations redrive-poison (the relay poison queue)
    POST /_local/api/actions/redrive-dlq/{queue}  python -m operations redrive-dlq (a consumer dead-letter
                                          queue's messages back to its queue)

Every error is JSON, {"error": {"code", "message"}} with a stable code: order_not_found (404),
invalid_status / invalid_limit (400), not_found (404), method_not_allowed (405),
unsupported_media_type (415), nothing_to_redrive and action_running (409), command_failed and
inspector_failed (500). An action's answer is the command's own report (per message, and its closing
counts), never only a status. POSTs must be JSON (Content-Type: application/json) from the page's own
origin: a form on another site cannot start a redrive.
"""

from __future__ import annotations

import json
import mimetypes
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from tools.local.console.activity import Entry
from tools.local.gateway.server import LOCAL_PREFIX, HttpAnswer
from tools.local.inspector.actions import (
    RECOVERY_COMMANDS,
    dead_letter_action,
    outcome_message,
    recovery_queues,
)
from tools.local.inspector.stack_view import InspectedStack, LocalStackView, QueueState
from tools.local.inspector.timeline import Hop, HopCache, build_hops, order_timeline, outbox_row_hop
from tools.local.operator_commands import CommandRun
from tools.local.supervision import ThreadHealth

STATIC_DIR = Path(__file__).with_name("static")
ORDER_STATUSES = ("PENDING", "CONFIRMED", "REJECTED", "CANCELLED")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
_API = f"{LOCAL_PREFIX}/api/"


class StackView(Protocol):
    """What the API reads and runs (stack_view.LocalStackView on a running stack; a fake in unit tests)."""

    @property
    def store(self) -> str: ...
    @property
    def order_store_name(self) -> str: ...
    def entries(self) -> list[Entry]: ...
    def orders(self) -> list[dict[str, Any]]: ...
    def order(self, order_id: str) -> dict[str, Any] | None: ...
    def outbox_rows(self, order_id: str) -> list[dict[str, Any]]: ...
    def queues(self, with_messages: bool = True) -> list[QueueState]: ...
    def parked_event_ids(self) -> frozenset[str]: ...
    def run_recovery(self, action: str) -> CommandRun: ...


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def not_found(message: str, code: str = "not_found", **extra: Any) -> ApiError:
    """The 404 for whatever the request names and the stack does not have."""
    return ApiError(HTTPStatus.NOT_FOUND, code, message, **extra)


def json_answer(status: int, document: dict[str, Any]) -> HttpAnswer:
    headers = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
    return HttpAnswer(status, headers, json.dumps(document).encode())


def error_answer(error: ApiError) -> HttpAnswer:
    return json_answer(error.status, {"error": {"code": error.code, "message": error.message}, **error.extra})


class InspectorApi:
    """Serves /_local/ for the gateway (which hands it every request under that prefix)."""

    prefix = LOCAL_PREFIX

    def __init__(
        self,
        view: StackView,
        action_queues: dict[str, str],
        health: Callable[[], list[ThreadHealth]] | None = None,
    ) -> None:
        self._view = view
        self._health = health  # the stack's supervised threads (tools/local/supervision.py)
        self._action_lock = threading.Lock()
        self._action_queues = action_queues  # the queue each action drains (logical id), for its messages
        self._hops = HopCache()

    # --- dispatch -------------------------------------------------------------------------------------
    def handle(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> HttpAnswer:
        parts = urlsplit(target)
        path = parts.path
        try:
            if path == LOCAL_PREFIX:
                return HttpAnswer(HTTPStatus.PERMANENT_REDIRECT, [("Location", f"{LOCAL_PREFIX}/")], b"")
            if not path.startswith(_API):
                self._only(method, "GET", "HEAD")
                return self._static(path.removeprefix(LOCAL_PREFIX + "/"))
            route = [unquote(segment) for segment in path.removeprefix(_API).split("/")]
            query = parse_qs(parts.query)
            return json_answer(HTTPStatus.OK, self._route(method, route, query, dict(headers)))
        except ApiError as error:
            return error_answer(error)
        except Exception as exc:  # noqa: BLE001 - whatever breaks, the page gets JSON that says what
            return error_answer(
                ApiError(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    "inspector_failed",
                    f"the inspector could not answer {method} {path}: {type(exc).__name__}: {exc}",
                )
            )

    def _route(
        self, method: str, route: list[str], query: dict[str, list[str]], headers: dict[str, str]
    ) -> dict[str, Any]:
        match route:
            case ["orders"]:
                self._only(method, "GET")
                return self.orders(query)
            case ["orders", order_id] if order_id:
                self._only(method, "GET")
                return self.order(order_id)
            case ["queues"]:
                self._only(method, "GET")
                return self.queues(with_messages=query.get("messages", ["1"])[-1] != "0")
            case ["health"]:
                self._only(method, "GET")
                return self.health()
            case ["actions", action] if action in RECOVERY_COMMANDS:
                self._only(method, "POST")
                self._check_post(headers)
                return self.run_action(action)
            case ["actions", "redrive-dlq", queue] if dead_letter_action(queue) in self._action_queues:
                self._only(method, "POST")
                self._check_post(headers)
                return self.run_action(dead_letter_action(queue))
            case ["actions", action]:
                raise not_found(f"no action {action!r}: the actions are {', '.join(RECOVERY_COMMANDS)}")
        raise not_found(
            f"no inspector endpoint {method} {_API}{'/'.join(route)}; see {LOCAL_PREFIX}/ for the page"
        )

    @staticmethod
    def _only(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise ApiError(
                HTTPStatus.METHOD_NOT_ALLOWED,
                "method_not_allowed",
                f"{method} is not allowed here; use {' or '.join(allowed)}",
            )

    @staticmethod
    def _check_post(headers: dict[str, str]) -> None:
        lowered = {name.lower(): value for name, value in headers.items()}
        if not lowered.get("content-type", "").startswith("application/json"):
            raise ApiError(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "actions take a JSON request (Content-Type: application/json), as the page sends",
            )
        origin, host = lowered.get("origin"), lowered.get("host")
        if origin is not None and urlsplit(origin).netloc != host:
            raise ApiError(
                HTTPStatus.FORBIDDEN, "forbidden_origin", f"actions are taken from the page at {host} only"
            )

    # --- the page ---------------------------------------------------------------------------------------
    def _static(self, name: str) -> HttpAnswer:
        name = name or "index.html"
        if name.startswith("static/"):
            name = name.removeprefix("static/")
        elif name != "index.html":
            name = ""  # only the page itself lives outside static/
        path = (STATIC_DIR / name).resolve()
        if not name or path.parent != STATIC_DIR.resolve() or not path.is_file():
            raise not_found(f"no inspector file {LOCAL_PREFIX}/{name}")
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if content_type.startswith("text/") or content_type.endswith("javascript"):
            content_type += "; charset=utf-8"
        headers = [("Content-Type", content_type), ("Cache-Control", "no-store")]
        return HttpAnswer(HTTPStatus.OK, headers, path.read_bytes())

    # --- orders -----------------------------------------------------------------------------------------
    def orders(self, query: dict[str, list[str]]) -> dict[str, Any]:
        status = (query.get("status", [""])[-1] or "").strip().upper()
        if status and status not in ORDER_STATUSES:
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                "invalid_status",
                f"status {status!r} is not an order status: {', '.join(ORDER_STATUSES)}",
            )
        customer = (query.get("customer", [""])[-1] or "").strip()
        raw_limit = query.get("limit", [str(DEFAULT_LIMIT)])[-1]
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIMIT:
            raise ApiError(
                HTTPStatus.BAD_REQUEST, "invalid_limit", f"limit must be 1 to {MAX_LIMIT}, got {raw_limit!r}"
            )
        every = self._view.orders()
        matching = [
            order
            for order in every
            if (not status or order.get("status") == status)
            and (not customer or customer.lower() in str(order.get("customerId", "")).lower())
        ]
        return {
            "store": self._view.store,
            "orderStore": self._view.order_store_name,
            "total": len(every),
            "matching": len(matching),
            "statuses": list(ORDER_STATUSES),
            "orders": matching[:limit],
        }

    def order(self, order_id: str) -> dict[str, Any]:
        order = self._view.order(order_id)
        if order is None:
            message = f"no order {order_id!r} in {self._view.order_store_name}"
            raise not_found(message, "order_not_found", orderId=order_id)
        hops = self.timeline(order_id)
        note = None
        if not hops:
            note = (
                "no hop of this order is in the activity log: it was placed before this stack started "
                "(PERSIST=1), or more than the log's last 10,000 entries ago"
            )
        return {
            "store": self._view.store,
            "orderStore": self._view.order_store_name,
            "order": order,
            "hops": [hop.to_json() for hop in hops],
            "note": note,
        }

    def timeline(self, order_id: str) -> list[Hop]:
        hops = build_hops(self._view.entries(), self._view.parked_event_ids(), self._hops)
        consumed = frozenset(h.keys.event_id for h in hops if h.trigger == "sqs" and h.keys.event_id)
        hops += [outbox_row_hop(row, consumed) for row in self._view.outbox_rows(order_id)]
        return order_timeline(hops, order_id)

    # --- the stack's threads ------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """Each supervised thread: alive, restarted how often, the error that stopped it last (or null)."""
        threads = self._health() if self._health is not None else []
        return {"threads": [thread.to_json() for thread in threads]}

    # --- queues and actions -----------------------------------------------------------------------------
    def queues(self, with_messages: bool = True) -> dict[str, Any]:
        return {"queues": [queue.to_json() for queue in self._view.queues(with_messages)]}

    def run_action(self, action: str) -> dict[str, Any]:
        queue = self._action_queues.get(action)
        if queue is None:
            output = RECOVERY_COMMANDS[action][0]
            raise not_found(f"this stack's template has no {output} output: {action} has no queue")
        if not self._action_lock.acquire(blocking=False):
            raise ApiError(
                HTTPStatus.CONFLICT, "action_running", "another redrive is running: wait for its report"
            )
        try:
            run = self._view.run_recovery(action)
        finally:
            self._action_lock.release()
        report = {"action": action, "queue": queue, **run.report()}
        summary = run.summary()
        if summary is None:
            raise ApiError(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "command_failed",
                f"{report['command']} exited {run.exit_code} without its closing report: "
                f"{(run.stderr.strip() or run.stdout.strip())[-600:] or 'no output'}",
                report=report,
            )
        if int(summary["redriven"]) == 0 and int(summary["kept"]) == 0 and not report["errors"]:
            raise ApiError(
                HTTPStatus.CONFLICT,
                "nothing_to_redrive",
                f"nothing to redrive: {queue} holds no message ({action} found none)",
                report=report,
            )
        complete = run.exit_code == 0
        return {**report, "complete": complete, "message": outcome_message(action, queue, summary, complete)}


def inspector_for(stack: InspectedStack) -> InspectorApi:
    """The inspector of a running stack (a LocalStack hands itself over here, and the inspector to its
    gateway, which knows only the prefix)."""
    # Looked up when asked for: a stand-in for the stack (the tests') need not have threads.
    return InspectorApi(LocalStackView(stack), recovery_queues(stack.template), lambda: stack.thread_health())
