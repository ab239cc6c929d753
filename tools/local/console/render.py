"""What a person sees: one line per hop as events flow (the start-up summary is summary.py).

Hop lines are derived from the invocations themselves (function, the events in the records, the result).
What the functions said about each record in their own log lines (console/reports.py) adds what the
answer does not carry: why a record failed, which record was parked in the poison queue, which events a
consumer ignored. The queue pollers' notices add the messages dead-lettered by their queue's redrive
policy. Records are described by the CloudEvents envelope they carry when there is one (in an outbox
item, an EventBridge event or an SNS message), so a line reads
`OutboxRelay  OrdersTable  OrderCreated o-123  ok`.

Every piece taken from a record goes through console/text.py, so no record can make a line fail, and an
entry that still cannot be rendered prints a line saying so. Lines are written by the console's printer
thread (console/printer.py): a poller that adds an entry never waits for the terminal, nor fails with it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO

from shop.adapters.dynamodb import keys as table_keys
from tools.local.console.activity import DEAD_LETTERED, Entry, Invocation, Notice, Publication
from tools.local.console.printer import ConsolePrinter
from tools.local.console.reports import FunctionReports, RecordReport
from tools.local.console.text import encodable, json_object, shown
from tools.local.supervision import describe_error

_RED, _YELLOW, _GREEN, _DIM, _RESET = (
    "\033[31m",
    "\033[33m",
    "\033[32m",
    "\033[2m",
    "\033[0m",
)
_MAX_RECORD_LINES = 20
_MAX_PAYLOAD_FIELDS = 12
_LABEL_WIDTH = 18
_MAX_ERROR_CHARS = 300


def short_name(logical_id: str) -> str:
    return logical_id.removesuffix("Function") or logical_id


def _cloud_event(document: dict[str, Any] | None) -> dict[str, Any] | None:
    """The CloudEvents envelope inside a document, looking through EventBridge and SNS wrappers."""
    if document is None:
        return None
    if "specversion" in document and "type" in document:
        return document
    if isinstance(document.get("detail"), dict):  # EventBridge event (SQS target body)
        return _cloud_event(document["detail"]) or {
            "type": document.get("detail-type"),
            "id": document.get("id"),
        }
    if document.get("Type") == "Notification":  # SNS envelope
        return _cloud_event(json_object(document.get("Message")))
    return None


def _string(attribute: Any) -> str | None:
    """The value of a DynamoDB string attribute ({"S": ...}), if it is one."""
    value = attribute.get("S") if isinstance(attribute, dict) else None
    return value if isinstance(value, str) and value else None


def _outbox_event(image: dict[str, Any]) -> dict[str, Any] | None:
    """The event of an outbox item: its envelope (shop/adapters/dynamodb/outbox_items.py), else (a poison
    item's envelope being unreadable) the eventId, eventType and aggregateId attributes an item written
    by earlier code carries. An item without them is named by its keys (describe_record)."""
    for value in image.values():
        found = _cloud_event(json_object(_string(value)))
        if found is not None:
            return found
    attributes = {
        "id": _string(image.get("eventId")),
        "type": _string(image.get("eventType")),
        "subject": _string(image.get("aggregateId")),
    }
    return attributes if attributes["id"] or attributes["type"] else None


def _summary(document: dict[str, Any]) -> str | None:
    """Type and subject of a message (its subject, or its first *Id field other than its own id)."""
    kind = document.get("type") or document.get("eventType") or document.get("detail-type")
    subject = document.get("subject") or next(
        (v for k, v in document.items() if str(k).endswith("Id") and k not in {"eventId", "messageId"}), None
    )
    text = " ".join(shown(part) for part in (kind, subject) if part)
    return text or None


@dataclass(frozen=True)
class RecordView:
    what: str  # what the record carries
    quoted_id: str  # the id to quote when it fails: its event's, else the record's own
    event_id: str | None  # the CloudEvent id it carries, if any


def describe_record(record: dict[str, Any]) -> RecordView:
    """A record of a stream or queue event, as a line shows it; any record, however malformed."""
    stream = record.get("dynamodb")
    if isinstance(stream, dict):
        image = stream.get("NewImage") or stream.get("OldImage")
        event = _outbox_event(image) if isinstance(image, dict) else None
        keys = stream.get("Keys")
        shown_keys = " ".join(
            f"{shown(name, 40)}={shown(next(iter(value.values()), ''), 40)}"
            for name, value in (keys.items() if isinstance(keys, dict) else ())
            if isinstance(value, dict)
        )
        fallback = f"{shown(record.get('eventName', '?'))} {shown_keys}".strip()
        fallback_id = shown(stream.get("SequenceNumber", ""))
        sort_key = _string(image.get(table_keys.SK)) if isinstance(image, dict) else None
        key_event_id = table_keys.outbox_event_id(sort_key) if sort_key else None  # what the key ends with
    else:
        event = _cloud_event(json_object(record.get("body")))
        fallback = shown(record.get("body", ""), 60)
        fallback_id = shown(record.get("messageId", ""))
        key_event_id = None
    if event is None:
        return RecordView(fallback, shown(key_event_id) if key_event_id else fallback_id, key_event_id)
    event_id = event.get("id") if isinstance(event.get("id"), str) and event.get("id") else key_event_id
    text = " ".join(shown(part) for part in (event.get("type"), event.get("subject")) if part)
    return RecordView(text or fallback, shown(event_id) if event_id else fallback_id, event_id)


def record_key(record: dict[str, Any]) -> str | None:
    """The id a batch response names a record by: an SQS messageId or a stream SequenceNumber."""
    if isinstance(record.get("messageId"), str):
        return str(record["messageId"])
    stream = record.get("dynamodb")
    return str(stream.get("SequenceNumber")) if isinstance(stream, dict) else None


def _answer_header(payload: dict[str, Any], name: str) -> Any:
    """A header of a proxy integration's answer (its lower-case `name`), as API Gateway merges the two maps:
    multiValueHeaders' first value (Powertools' REST resolver answers with those alone) over headers';
    None when neither holds it, or neither is a map."""
    multi = payload.get("multiValueHeaders")
    for key, values in multi.items() if isinstance(multi, dict) else ():
        if str(key).lower() == name and isinstance(values, list) and values:
            return values[0]
    headers = payload.get("headers")
    for key, value in headers.items() if isinstance(headers, dict) else ():
        if str(key).lower() == name:
            return value
    return None


class Console:
    def __init__(self, stream: TextIO = sys.stdout, color: bool | None = None) -> None:
        self._stream = stream
        if color is None:
            color = stream.isatty() and "NO_COLOR" not in os.environ
        self._color = color
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._lock = threading.Lock()
        # What the functions say about their records (the stack feeds its own in: use_reports).
        self.reports = FunctionReports()
        self._at_once: frozenset[str] = frozenset()
        self.printer = ConsolePrinter(self)

    def use_reports(self, reports: FunctionReports, at_once: frozenset[str] = frozenset()) -> None:
        """Read these reports; those of the functions `at_once` (scheduled: the polling publisher runs for
        up to a minute) print a line as each record is parked or fails, not when the invocation ends."""
        self.reports = reports
        self._at_once = at_once
        reports.subscribe(self._on_report)

    def _on_report(self, function: str, report: RecordReport) -> None:
        if function in self._at_once and report.kind in {"parked", "failed"}:
            self.post(self.report_line(function, report))

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self._color else text

    def print(self, text: str = "") -> None:
        """Write a line now (start-up, shutdown); hop lines go through on_entry and the printer. What the
        stream cannot encode (a lone surrogate, in UTF-8) is written as an escape, not raised on."""
        with self._lock:
            self._stream.write(encodable(text, self._encoding) + "\n")
            self._stream.flush()

    # --- from the stack's threads: queued for the printer -------------------------------------------
    def on_entry(self, entry: Entry) -> None:
        self.printer.post(entry)

    def post(self, line: str) -> None:
        """A line to print in turn with the hop lines (a function's own log line, with LOGS=1)."""
        self.printer.post(line)

    def flush(self, timeout: float) -> None:
        """Wait until what was posted is printed (at most `timeout` s)."""
        self.printer.flush(timeout)

    # --- rendering ------------------------------------------------------------------------------------
    def lines(self, entry: Entry, reports: list[RecordReport] | None = None) -> list[str]:
        """The lines an entry prints; a line saying so when it cannot be rendered."""
        try:
            if isinstance(entry, Invocation):
                return self.invocation_lines(entry, reports or [])
            if isinstance(entry, Notice):
                return [self.notice_line(entry)]
            return [self.publication_line(entry)]
        except Exception as exc:  # noqa: BLE001 - a line about the entry, whatever it holds
            at = getattr(entry, "at", 0.0)
            prefix = self._prefix(at if isinstance(at, float) else 0.0, "console")
            what = f"({type(entry).__name__} the console cannot show: {describe_error(exc)})"
            return [f"{prefix}{self.paint(what, _RED)}"]

    def _prefix(self, at: float, label: str) -> str:
        stamp = datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]
        return f"{self.paint(stamp, _DIM)}  {shown(label, _LABEL_WIDTH):<{_LABEL_WIDTH}} "

    def invocation_lines(
        self, invocation: Invocation, reports: list[RecordReport] | None = None
    ) -> list[str]:
        label = short_name(invocation.function)
        result = invocation.result
        timing = self.paint(f"{result.duration_ms:.0f} ms" + (" cold" if result.cold_start else ""), _DIM)
        if invocation.trigger == "api":
            return [self._api_line(invocation, label, timing)]
        if invocation.trigger == "schedule":
            return [self._returned_line(invocation, label, timing, "schedule")]
        if invocation.trigger == "direct" and not invocation.records:  # the Invoke API, make invoke
            return [self._returned_line(invocation, label, timing, "invoked by")]
        records = invocation.records
        lines = []
        for record in records[:_MAX_RECORD_LINES]:
            view = describe_record(record)
            outcome = self._outcome(invocation, record, view, reports or [])
            source = shown(invocation.source)
            lines.append(f"{self._prefix(invocation.at, label)}{source}  {view.what}  {outcome}  {timing}")
        if len(records) > _MAX_RECORD_LINES:
            more = len(records) - _MAX_RECORD_LINES
            lines.append(f"{self._prefix(invocation.at, label)}… and {more} more record(s) in this batch")
        return lines

    def _outcome(
        self, invocation: Invocation, record: dict[str, Any], view: RecordView, reports: list[RecordReport]
    ) -> str:
        report = next((r for r in reports if r.concerns(record, view.event_id)), None)
        error = invocation.result.error
        if record_key(record) in invocation.failed_ids:
            if error is not None:
                cause = f" {shown(error.error_type)}: {shown(error.message, _MAX_ERROR_CHARS)}"
            elif report is not None and report.kind == "failed":
                cause = f" {shown(report.detail, _MAX_ERROR_CHARS)}"
            else:
                cause = ", reported for retry"  # and the function said nothing about it in its log
            return self.paint(f"FAILED{cause} (event {view.quoted_id})", _RED)
        if report is None or report.kind in {"applied", "published"}:
            return self.paint("ok", _GREEN)
        if report.kind == "ignored":
            return self.paint(f"ignored ({shown(report.detail)})", _YELLOW)
        if report.kind == "parked":  # under the event id the relay parked it by (redrive-poison's)
            detail, event = shown(report.detail, _MAX_ERROR_CHARS), shown(report.event_id or view.quoted_id)
            return self.paint(f"parked in the relay poison queue: {detail} (event {event})", _YELLOW)
        return self.paint(f"FAILED {shown(report.detail, _MAX_ERROR_CHARS)} (event {view.quoted_id})", _RED)

    def _api_line(self, invocation: Invocation, label: str, timing: str) -> str:
        result = invocation.result
        event = invocation.event if isinstance(invocation.event, dict) else {}
        payload = result.payload if isinstance(result.payload, dict) else {}
        status = payload.get("statusCode")
        context = event.get("requestContext")
        request_id = shown(context.get("requestId", "") if isinstance(context, dict) else "")
        text = f"{shown(event.get('httpMethod'))} {shown(event.get('path'))}"
        if result.error is not None:
            error = f"{shown(result.error.error_type)}: {shown(result.error.message, _MAX_ERROR_CHARS)}"
            detail = f"502 FAILED {error} (request {request_id})"
            return f"{self._prefix(invocation.at, label)}{text} {self.paint(detail, _RED)}  {timing}"
        found = _answer_header(payload, "location")
        location = f" → {shown(found)}" if found is not None else ""
        shown_status = f"{shown(status)}{location}"
        if not isinstance(status, int) or status >= 500:
            shown_status = self.paint(f"{shown_status} (request {request_id})", _RED)
        elif status >= 400:
            shown_status = self.paint(shown_status, _YELLOW)
        return f"{self._prefix(invocation.at, label)}{text} {shown_status}  {timing}"

    def _returned_line(self, invocation: Invocation, label: str, timing: str, how: str) -> str:
        """A run with no records: what the function returned (the publisher's totals, a maintenance
        command's report), or its error (what it parked or could not publish was printed as it happened:
        report_line)."""
        result = invocation.result
        if result.error is not None:
            error = f"{shown(result.error.error_type)}: {shown(result.error.message, _MAX_ERROR_CHARS)}"
            outcome = self.paint(f"FAILED {error}", _RED)
        elif isinstance(result.payload, dict):
            fields = list(result.payload.items())[:_MAX_PAYLOAD_FIELDS]
            outcome = " ".join(f"{shown(k)}={shown(v)}" for k, v in fields)
        else:
            outcome = self.paint("ok", _GREEN)
        return f"{self._prefix(invocation.at, label)}{how} {shown(invocation.source)}  {outcome}  {timing}"

    def report_line(self, function: str, report: RecordReport) -> str:
        """A record a function parked in the poison queue, or could not publish, as it said in its log."""
        prefix = self._prefix(time.time(), short_name(function))
        event, detail = shown(report.event_id or "?"), shown(report.detail, _MAX_ERROR_CHARS)
        if report.kind == "parked":
            parked = f"parked in the relay poison queue: {detail} (event {event})"
            return f"{prefix}{self.paint(parked, _YELLOW)}"
        return f"{prefix}{self.paint(f'FAILED {detail} (event {event}); it waits, in order', _RED)}"

    def notice_line(self, notice: Notice) -> str:
        dead_lettered = notice.details.get(DEAD_LETTERED)
        if isinstance(dead_lettered, dict):
            return self._dead_letter_line(notice, dead_lettered)
        colour = {"error": _RED, "warning": _YELLOW}.get(notice.level, "")
        message = shown(notice.message, 2000)
        message = self.paint(message, colour) if colour else message
        return f"{self._prefix(notice.at, short_name(notice.component.split('.')[0]))}{message}"

    def _dead_letter_line(self, notice: Notice, moved: dict[str, Any]) -> str:
        """A message its queue's redrive policy moves to the dead-letter queue (queue_poller.py)."""
        record = moved.get("record")
        view = describe_record(record if isinstance(record, dict) else {})
        receives, limit = shown(moved.get("receiveCount")), shown(moved.get("maxReceiveCount"))
        where = f"→ {shown(moved.get('deadLetterQueue'))} after {receives} receives (maxReceiveCount {limit})"
        outcome = self.paint(f"dead-lettered {where} (event {view.quoted_id})", _RED)
        label = short_name(notice.component.split(".")[0])
        return f"{self._prefix(notice.at, label)}{shown(moved.get('queue'))}  {view.what}  {outcome}"

    def publication_line(self, publication: Publication) -> str:
        document = json_object(publication.message)
        what = _summary(_cloud_event(document) or document) if document else None
        subject = f"“{shown(publication.subject)}” " if publication.subject else ""
        text = what or shown(publication.message, 60)
        return f"{self._prefix(publication.at, publication.topic)}published {subject}{text}"
