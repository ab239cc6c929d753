"""What the functions say about each record they handled, read from their own structured log lines.

A function's answer to a batch names only the records that failed. What happened to the others, and
why a record failed, the functions say in the JSON lines Powertools writes during the invocation, each
tied to it by `function_request_id` (as CloudWatch Logs Insights would read them):

    "event applied"            a consumer applied an event; its `outcome` says how: `ignored:<STATUS>`
                               (order status: the order had moved on) and `stale` (inventory: decided
                               already) are events it ignored (shop/domain/orders.py, inventory.py)
    "duplicate event skipped"  a consumer's idempotency found the event applied already (its
                               `causation_id` is the event's id): ignored
    "message failed; ..."      a consumer's record failed: `error_type`, `error`, `message_id`, `event_id`
    "events published"         the relay or the publisher put events on the bus: `event_ids` (a line per
                               ten events, a report per event)
    "poison outbox record"     the relay or the publisher parked a record in the poison queue: `event_id`,
                               `sequence_number` (stream records), `reason`
    "publish failed; ..."      the relay or the publisher could not publish an event: `event_id`,
                               `sequence_number` (stream records), `failures_by_code`

(shop/runtime/consumer.py, relay.py, polling_publisher.py, outbox_publishing.py write them; at a
LogLevel above INFO only the failures and parked records are written.) Lines are fed by the log pumps,
from their threads: nothing here raises, whatever a line holds.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tools.local.supervision import describe_error

Kind = Literal["applied", "ignored", "published", "parked", "failed"]
ReportListener = Callable[[str, "RecordReport"], None]  # (function, report), as each one arrives
_KEEP_REQUESTS = 10_000
# The messages read, and a cheap test that a line may hold one (most lines are skipped unparsed).
_APPLIED, _DUPLICATE, _CONSUMER_FAILED = "event applied", "duplicate event skipped", "message failed;"
_PUBLISHED, _PARKED, _PUBLISH_FAILED = "events published", "poison outbox record", "publish failed;"
_MARKERS = (_APPLIED, _DUPLICATE, _CONSUMER_FAILED, _PUBLISHED, _PARKED, _PUBLISH_FAILED)
_MAX_DETAIL_CHARS = 300


@dataclass(frozen=True)
class RecordReport:
    """What a function said about one record of an invocation."""

    kind: Kind
    detail: str = ""  # how it was applied or ignored, why it was parked or failed
    event_id: str | None = None
    message_id: str | None = None  # SQS records
    sequence_number: str | None = None  # stream records

    def concerns(self, record: dict[str, Any], event_id: str | None) -> bool:
        """Whether this report is about that record (of an SQS or stream event) carrying that event id."""
        if self.message_id is not None and self.message_id == record.get("messageId"):
            return True
        stream = record.get("dynamodb")
        if self.sequence_number is not None and isinstance(stream, dict):
            return self.sequence_number == str(stream.get("SequenceNumber"))
        return self.event_id is not None and self.event_id == event_id


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _detail(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 1] + "…"


def _applied(outcome: str) -> tuple[Kind, str]:
    if outcome.startswith("ignored:"):
        return "ignored", f"order {outcome.removeprefix('ignored:')}"
    if outcome == "stale":
        return "ignored", "stale: decided already"
    return "applied", outcome


def read_reports(line: dict[str, Any]) -> list[RecordReport]:
    """The reports one log line makes: a report per event it names ("events published" names up to ten)."""
    if line.get("message") == _PUBLISHED:
        ids = line.get("event_ids")
        return [RecordReport("published", "", _text(i)) for i in ids] if isinstance(ids, list) else []
    report = read_report(line)
    return [] if report is None else [report]


def read_report(line: dict[str, Any]) -> RecordReport | None:
    """The report a log line about one record makes, if any."""
    message = line.get("message")
    if not isinstance(message, str):
        return None
    event_id = _text(line.get("event_id"))
    if message == _APPLIED:
        kind, detail = _applied(str(line.get("outcome", "")))
        return RecordReport(kind, detail, event_id)
    if message == _DUPLICATE:
        return RecordReport("ignored", "duplicate", _text(line.get("causation_id")))
    if message.startswith(_CONSUMER_FAILED):
        error = f"{line.get('error_type', 'Error')}: {line.get('error', '')}"
        return RecordReport("failed", _detail(error), event_id, message_id=_text(line.get("message_id")))
    sequence = _text(line.get("sequence_number"))
    if message == _PARKED:
        return RecordReport("parked", _detail(line.get("reason", "")), event_id, sequence_number=sequence)
    if message.startswith(_PUBLISH_FAILED):
        codes = line.get("failures_by_code")
        counts = ", ".join(f"{c} x{n}" for c, n in codes.items()) if isinstance(codes, dict) else ""
        detail = _detail(f"PutEvents {counts or 'failed'}")
        return RecordReport("failed", detail, event_id, sequence_number=sequence)
    return None


class FunctionReports:
    """Reports by invocation (request id), from the log lines of every function; bounded, thread-safe."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._by_request: OrderedDict[str, list[RecordReport]] = OrderedDict()
        self._reporting: set[str] = set()  # functions that wrote a report at least once
        self._listeners: list[ReportListener] = []

    def subscribe(self, listener: ReportListener) -> None:
        """Call `listener` with each report as it arrives (from a log pump's thread)."""
        with self._changed:
            self._listeners.append(listener)

    def on_log_line(self, function: str, line: str) -> None:
        """A line a function wrote (any text: most are skipped); never raises."""
        if not any(marker in line for marker in _MARKERS):
            return
        try:
            document = json.loads(line)
            reports = read_reports(document) if isinstance(document, dict) else []
            request_id = document.get("function_request_id") if reports else None
        except (ValueError, RecursionError, TypeError, AttributeError):
            return  # not one of Powertools' lines
        if not reports or not isinstance(request_id, str):
            return
        with self._changed:
            self._reporting.add(function)
            self._by_request.setdefault(request_id, []).extend(reports)
            self._by_request.move_to_end(request_id)
            while len(self._by_request) > _KEEP_REQUESTS:
                self._by_request.popitem(last=False)
            self._changed.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            for report in reports:
                try:
                    listener(function, report)
                except Exception as exc:  # noqa: BLE001 - the log pump that called this must go on
                    sys.stderr.write(f"local stack: a report listener failed: {describe_error(exc)}\n")

    def reports(self, function: str) -> bool:
        """Whether the function has written any report (only those are waited for)."""
        with self._changed:
            return function in self._reporting

    def of(self, request_id: str) -> list[RecordReport]:
        with self._changed:
            return list(self._by_request.get(request_id, ()))

    def wait(self, request_id: str, enough: int, timeout: float) -> list[RecordReport]:
        """The invocation's reports once there are `enough` of them, or what there is after `timeout` s."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._by_request.get(request_id, ())) >= enough, timeout)
            return list(self._by_request.get(request_id, ()))
