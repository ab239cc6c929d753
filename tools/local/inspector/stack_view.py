"""What the inspector reads from a running local stack: its activity log with what the functions said
about each record in their log lines (the stack's FunctionReports), the order store (DynamoDB's
OrdersTable, or the PostgreSQL order database with OrderStore=postgres), the queues through the moto
endpoint, and the operator commands it runs (actions.py).

Queues are read without disturbing them. Counts come from GetQueueAttributes. Message bodies are read
only from the queues no event source consumes (dead-letter queues, the relay poison queue), with a
receive whose visibility timeout is 0: each message stays visible to everyone, so a redrive running at
the same moment still finds it, and the receive count it raises means nothing for queues without a
redrive policy. A consumer's own queue is never received from: a receive counts towards its
maxReceiveCount and would move a message to the dead-letter queue sooner. So a dead-lettered message's
receive count and last error are not read from the message (each peek raises its count) but from the
stack's own record of its deliveries: the last invocation that got it, with the count it was delivered
with and why it failed (a stream batch's OnFailure document names its last invocation).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from shop.domain.serialization import camel_fields
from tools.local.console.activity import Entry, Invocation, Notice
from tools.local.console.text import json_value
from tools.local.inspector.actions import (
    POISON_QUEUE_OUTPUT,
    RECOVERY_COMMANDS,
    CommandTarget,
    dead_letter_action,
    dead_letter_sources,
    recovery_queues,
    run_recovery,
)
from tools.local.inspector.timeline import Hop, HopCache, build_hops, report_notice
from tools.local.operator_commands import CommandRun

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from tools.local.console.activity import ActivityLog
    from tools.local.console.reports import FunctionReports
    from tools.local.services.emulators import AwsClients
    from tools.local.services.order_database import DatabaseLocation
    from tools.local.supervision import ThreadHealth

ORDERS_TABLE = "OrdersTable"
PEEK_MESSAGES = 10  # one receive's maximum: a visibility-0 receive returns the same first ones again
_ORDER_FIELDS = (
    "orderId",
    "customerId",
    "status",
    "version",
    "totalAmount",
    "currency",
    "createdAt",
    "updatedAt",
)
_ORDER_COLUMNS = "order_id, customer_id, status, version, total_amount, currency, created_at, updated_at"


class InspectedStack(CommandTarget, Protocol):
    """What the inspector reads of a running stack (a LocalStack hands itself over): besides what its
    commands read, its clients, order database, activity log, the functions' reports on their records,
    and the health of its threads."""

    @property
    def clients(self) -> AwsClients: ...
    @property
    def order_database(self) -> DatabaseLocation: ...
    @property
    def activity(self) -> ActivityLog: ...
    @property
    def reports(self) -> FunctionReports: ...
    def thread_health(self) -> list[ThreadHealth]: ...


@dataclass(frozen=True)
class QueueState:
    logical_id: str
    role: str  # consumer queue, consumer dead-letter queue, relay dead-letter queue, relay poison queue
    visible: int
    in_flight: int
    delayed: int
    consumer: str | None = None  # the function its event source feeds
    dead_letter_for: str | None = None  # the queue whose redrive policy moves messages here
    action: str | None = None  # the operations command that drains it
    peeked: bool = False  # whether its messages were read (never a consumer's own queue)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the first PEEK_MESSAGES

    def to_json(self) -> dict[str, Any]:
        return camel_fields(self)


def _plain(value: dict[str, Any]) -> Any:
    """A DynamoDB attribute value as plain JSON (the order's fields are strings, numbers and lists)."""
    (kind, inner), *_ = value.items()
    if kind == "N":
        number = float(inner)
        return int(number) if number.is_integer() else number
    if kind == "L":
        return [_plain(v) for v in inner]
    if kind == "M":
        return {k: _plain(v) for k, v in inner.items()}
    return inner


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_summary(body: Any) -> dict[str, Any]:
    """What a dead-lettered or parked message is, in a few fields, next to its whole body."""
    if not isinstance(body, dict):
        return {}
    if body.get("kind") == "outbox-poison":  # shop/adapters/poison_queue.py
        return {
            "eventId": body.get("eventId"),
            "reason": body.get("reason"),
            "details": body.get("details"),
            "parkedAt": body.get("parkedAt"),
        }
    batch = body.get("DDBStreamBatchInfo")
    if isinstance(batch, dict):  # a stream mapping's OnFailure document
        return {
            "condition": (body.get("requestContext") or {}).get("condition"),
            "batchSize": batch.get("batchSize"),
            "records": f"{batch.get('startSequenceNumber')}..{batch.get('endSequenceNumber')}",
        }
    detail = body.get("detail")
    if isinstance(detail, dict):  # an EventBridge event, as a rule target delivers it
        return {
            "eventId": detail.get("id"),
            "eventType": detail.get("type"),
            "orderId": detail.get("subject"),
        }
    return {}


class Deliveries:
    """What the stack saw of each message before it was dead-lettered: the hops of the invocations that
    received it (by message id; a stream batch's by the request id its OnFailure document names)."""

    def __init__(self, hops: list[Hop]) -> None:
        self._by_message: dict[str, Hop] = {}
        self._by_request: dict[str, list[Hop]] = {}
        for hop in hops:  # in start order: the last one of a message stays
            if hop.trigger == "sqs" and hop.record_id:
                self._by_message[hop.record_id] = hop
            self._by_request.setdefault(hop.request_id, []).append(hop)

    def told(self, message: dict[str, Any]) -> dict[str, Any]:
        """The peeked message with its receive count and last error (None where the stack saw none)."""
        body = message.get("body")
        request = (body.get("requestContext") or {}) if isinstance(body, dict) else {}
        if isinstance(request, dict) and request.get("requestId"):  # a stream batch's OnFailure document
            failed = [h for h in self._by_request.get(str(request["requestId"]), []) if h.error]
            count = request.get("approximateInvokeCount")
            return {
                **message,
                "receiveCount": None,
                "invokeCount": count if isinstance(count, int) else None,
                "lastError": failed[0].error if failed else None,
            }
        last = self._by_message.get(str(message.get("messageId")))
        return {
            **message,
            "receiveCount": last.attempt if last is not None else None,
            "lastError": (last.error if last is not None else None) or message.get("deliveryError"),
            "lastFunction": last.function if last is not None else None,
        }


class LocalStackView:
    """The inspector's reads and actions on one running stack (thread-safe: the gateway serves requests
    on threads of their own)."""

    def __init__(self, stack: InspectedStack) -> None:
        self._stack = stack
        self._lock = threading.Lock()
        self._dynamodb: DynamoDBClient | None = None
        self._sqs: SQSClient | None = None
        # Every event id seen in the relay poison queue: a hop that parked its record stays "parked" on
        # the timeline after a redrive has taken the message away.
        self._seen_parked: set[str] = set()
        self._hops = HopCache()  # for the dead-letter queues' deliveries
        # Each invocation's reports as notices, made again only when more have come (the page asks every
        # second, and a function's log lines may arrive after its invocation is recorded).
        self._report_notices: dict[str, list[Notice]] = {}

    # --- clients, made once (a boto3 client takes tens of milliseconds to create) ----------------------
    def _dynamodb_client(self) -> DynamoDBClient:
        with self._lock:
            if self._dynamodb is None:
                self._dynamodb = self._stack.clients.dynamodb()
            return self._dynamodb

    def _sqs_client(self) -> SQSClient:
        with self._lock:
            if self._sqs is None:
                self._sqs = self._stack.clients.sqs()
            return self._sqs

    # --- what the stack is ------------------------------------------------------------------------------
    @property
    def store(self) -> str:
        return str(self._stack.template.parameter_values.get("OrderStore", "dynamodb"))

    @property
    def order_store_name(self) -> str:
        if self.store == "postgres":
            return f"the order database {self._stack.order_database.name}"
        return self._stack.template.physical_name(ORDERS_TABLE)

    def entries(self) -> list[Entry]:
        """The activity log, and what the functions said about each record of each invocation (as
        notices: timeline.report_notice)."""
        entries = self._stack.activity.entries()
        notices: list[Entry] = []
        with self._lock:
            known, current = self._report_notices, {}
            for entry in entries:
                if not isinstance(entry, Invocation) or entry.trigger not in {"sqs", "dynamodb"}:
                    continue
                request_id = entry.result.request_id
                reports = self._stack.reports.of(request_id)
                made = known.get(request_id, [])
                if len(made) != len(reports):
                    made = [report_notice(entry.function, request_id, report) for report in reports]
                current[request_id] = made
                notices.extend(made)
            self._report_notices = current  # invocations the activity log has dropped are forgotten
        return [*entries, *notices]

    # --- orders ---------------------------------------------------------------------------------------
    def orders(self) -> list[dict[str, Any]]:
        """Every order of the store, newest first (no lines)."""
        if self.store == "postgres":
            return self._database_orders()
        found: list[dict[str, Any]] = []
        paginator = self._dynamodb_client().get_paginator("scan")
        for page in paginator.paginate(
            TableName=self._stack.template.physical_name(ORDERS_TABLE),
            FilterExpression="SK = :order",
            ExpressionAttributeValues={":order": {"S": "ORDER"}},
            ProjectionExpression=", ".join(f"#{name}" for name in _ORDER_FIELDS),
            ExpressionAttributeNames={f"#{name}": name for name in _ORDER_FIELDS},
        ):
            found.extend({k: _plain(dict(v)) for k, v in item.items()} for item in page.get("Items", []))
        found.sort(key=lambda order: str(order.get("createdAt", "")), reverse=True)
        return found

    def order(self, order_id: str) -> dict[str, Any] | None:
        if self.store == "postgres":
            return self._database_order(order_id)
        item = (
            self._dynamodb_client()
            .get_item(
                TableName=self._stack.template.physical_name(ORDERS_TABLE),
                Key={"PK": {"S": f"ORDER#{order_id}"}, "SK": {"S": "ORDER"}},
                ConsistentRead=True,
            )
            .get("Item")
        )
        if item is None:
            return None
        return {k: _plain(dict(v)) for k, v in item.items() if k in {*_ORDER_FIELDS, "lines"}}

    def _database_orders(self) -> list[dict[str, Any]]:
        with self._stack.order_database.connect() as connection:
            rows = connection.execute(
                f"SELECT {_ORDER_COLUMNS} FROM orders ORDER BY created_at DESC"  # noqa: S608 - constant columns
            ).fetchall()
        return [self._database_row(row) for row in rows]

    @staticmethod
    def _database_row(row: tuple[Any, ...]) -> dict[str, Any]:
        return dict(zip(_ORDER_FIELDS, [*row[:6], _iso(row[6]), _iso(row[7])], strict=True))

    def _database_order(self, order_id: str) -> dict[str, Any] | None:
        with self._stack.order_database.connect() as connection:
            row = connection.execute(
                f"SELECT {_ORDER_COLUMNS} FROM orders WHERE order_id = %s",  # noqa: S608 - constant columns
                (order_id,),
            ).fetchone()
            if row is None:
                return None
            lines = connection.execute(
                "SELECT sku, quantity, unit_price FROM order_lines WHERE order_id = %s ORDER BY line_no",
                (order_id,),
            ).fetchall()
        order = self._database_row(row)
        order["lines"] = [{"sku": s, "quantity": q, "unitPrice": p} for s, q, p in lines]
        return order

    def outbox_rows(self, order_id: str) -> list[dict[str, Any]]:
        """OrderStore=postgres: the order's outbox rows (its events from the commit to the bus)."""
        if self.store != "postgres":
            return []
        with self._stack.order_database.connect() as connection:
            rows = connection.execute(
                # As text, read here: psycopg's json.loads raises on what an outbox may hold (an integer past
                # Python's digit limit, nesting past its recursion limit).
                "SELECT position, event_id, aggregate_id, event_type, envelope::text, created_at,"
                " published_at, parked_at, attempts, last_error"
                " FROM outbox WHERE aggregate_id = %s ORDER BY position",
                (order_id,),
            ).fetchall()
        names = ("position", "event_id", "aggregate_id", "event_type", "envelope", "created_at")
        return [
            {
                **dict(zip(names, row[:6], strict=True)),
                "envelope": json_value(row[4]),
                "created_at": _epoch(row[5]),
                "published_at": _epoch(row[6]),
                "parked_at": _epoch(row[7]),
                "attempts": row[8],
                "last_error": row[9],
            }
            for row in rows
        ]

    # --- queues ---------------------------------------------------------------------------------------
    def _roles(self) -> dict[str, dict[str, Any]]:
        template = self._stack.template
        roles: dict[str, dict[str, Any]] = {}
        for source in self._stack.sources.queues:
            roles[source.queue] = {"role": "consumer queue", "consumer": source.function}
        for dead_letter_queue, source_queue in dead_letter_sources(template).items():
            roles[dead_letter_queue] = {
                "role": "consumer dead-letter queue",
                "dead_letter_for": source_queue,
                "action": dead_letter_action(dead_letter_queue),
            }
        for action, logical_id in recovery_queues(template).items():
            if action not in RECOVERY_COMMANDS:
                continue  # a dead-letter queue's, above
            poison = RECOVERY_COMMANDS[action][0] == POISON_QUEUE_OUTPUT
            roles[logical_id] = {
                "role": "relay poison queue" if poison else "relay dead-letter queue",
                "action": action,
            }
        return roles

    def queues(self, with_messages: bool = True) -> list[QueueState]:
        """Every queue of the template, with its counts, and the first messages of those no event
        source consumes."""
        sqs = self._sqs_client()
        states = []
        roles = self._roles()
        deliveries = Deliveries(build_hops(self.entries(), cache=self._hops)) if with_messages else None
        for logical_id in self._stack.template.of_type("AWS::SQS::Queue"):
            if not self._stack.template.is_created(logical_id):
                continue
            url = self._stack.queue_url(logical_id)
            attributes = sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"]
            role = roles.get(logical_id, {"role": "queue"})
            peek = with_messages and role["role"] != "consumer queue"
            states.append(
                QueueState(
                    logical_id=logical_id,
                    role=role["role"],
                    visible=int(attributes.get("ApproximateNumberOfMessages", 0)),
                    in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
                    delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
                    consumer=role.get("consumer"),
                    dead_letter_for=role.get("dead_letter_for"),
                    action=role.get("action"),
                    peeked=peek,
                    messages=[deliveries.told(m) for m in self._peek(url)] if peek and deliveries else [],
                )
            )
            if role.get("action") == "redrive-poison":
                self._remember_parked(states[-1].messages)
        return states

    def _remember_parked(self, messages: list[dict[str, Any]]) -> frozenset[str]:
        parked = {str(m["summary"]["eventId"]) for m in messages if m["summary"].get("eventId")}
        with self._lock:
            self._seen_parked |= parked
            return frozenset(self._seen_parked)

    def _peek(self, url: str) -> list[dict[str, Any]]:
        received = (
            self._sqs_client()
            .receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=PEEK_MESSAGES,
                VisibilityTimeout=0,
                WaitTimeSeconds=0,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],  # EventBridge's ERROR_CODE, ERROR_MESSAGE on a failed delivery
            )
            .get("Messages", [])
        )
        messages = []
        for message in received:
            text = message.get("Body", "")
            try:
                body: Any = json.loads(text)
            except ValueError:
                body = text
            attributes = message.get("Attributes", {})
            error_attributes = {
                name: value.get("StringValue")
                for name, value in message.get("MessageAttributes", {}).items()
                if name in {"ERROR_CODE", "ERROR_MESSAGE"}
            }
            messages.append(
                {
                    "messageId": message.get("MessageId"),
                    "sentAtMs": int(attributes.get("SentTimestamp", 0)) or None,
                    "summary": message_summary(body),
                    "body": body,
                    "deliveryError": ": ".join(str(v) for v in error_attributes.values()) or None,
                }
            )
        return messages

    def parked_event_ids(self) -> frozenset[str]:
        """The events in the relay poison queue now (its first PEEK_MESSAGES) or seen there before."""
        poison_queue = recovery_queues(self._stack.template).get("redrive-poison")
        if poison_queue is None:
            return frozenset()
        return self._remember_parked(self._peek(self._stack.queue_url(poison_queue)))

    # --- actions --------------------------------------------------------------------------------------
    def run_recovery(self, action: str) -> CommandRun:
        return run_recovery(self._stack, action)
