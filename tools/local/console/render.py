"""What a person sees: the start-up summary, then one line per hop as events flow.

Hop lines are derived from the invocations themselves (function, the events in the records, the
result), never from the functions' logs. Records are described by the CloudEvents envelope they
carry when there is one (in an outbox item, an EventBridge event or an SNS message), so a line reads
`OutboxRelay  OrdersTable  OrderCreated o-123  ok`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import datetime
from typing import Any, TextIO

from tools.local.console.activity import Entry, Invocation, Notice, Publication

_RED, _YELLOW, _GREEN, _DIM, _BOLD, _RESET = (
    "\033[31m",
    "\033[33m",
    "\033[32m",
    "\033[2m",
    "\033[1m",
    "\033[0m",
)
_MAX_RECORD_LINES = 20
_LABEL_WIDTH = 18


def short_name(logical_id: str) -> str:
    return logical_id.removesuffix("Function") or logical_id


def _json_object(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str) or not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


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
        return _cloud_event(_json_object(document.get("Message")))
    return None


def _describe_image(image: dict[str, Any]) -> dict[str, Any] | None:
    for value in image.values():
        if isinstance(value, dict):
            found = _cloud_event(_json_object(value.get("S")))
            if found is not None:
                return found
    return None


def _summary(document: dict[str, Any]) -> str | None:
    """Type and subject of a message (its subject, or its first *Id field other than its own id)."""
    kind = document.get("type") or document.get("eventType") or document.get("detail-type")
    subject = document.get("subject") or next(
        (v for k, v in document.items() if k.endswith("Id") and k not in {"eventId", "messageId"}), None
    )
    text = " ".join(str(part) for part in (kind, subject) if part)
    return text or None


def describe_record(record: dict[str, Any]) -> tuple[str, str]:
    """(what the record carries, the id to quote when it fails)."""
    event: dict[str, Any] | None = None
    if "dynamodb" in record:
        dynamodb = record["dynamodb"]
        event = _describe_image(dynamodb.get("NewImage") or dynamodb.get("OldImage") or {})
        fallback = " ".join(
            f"{name}={next(iter(value.values()))}" for name, value in (dynamodb.get("Keys") or {}).items()
        )
        fallback = f"{record.get('eventName', '?')} {fallback}"
        fallback_id = str(dynamodb.get("SequenceNumber", ""))
    else:
        event = _cloud_event(_json_object(record.get("body")))
        body = str(record.get("body", ""))
        fallback = body[:60] + ("…" if len(body) > 60 else "")
        fallback_id = str(record.get("messageId", ""))
    if event is None:
        return fallback, fallback_id
    text = " ".join(str(part) for part in (event.get("type"), event.get("subject")) if part)
    return text or fallback, str(event.get("id") or fallback_id)


class Console:
    def __init__(self, stream: TextIO = sys.stdout, color: bool | None = None) -> None:
        self._stream = stream
        if color is None:
            color = stream.isatty() and "NO_COLOR" not in os.environ
        self._color = color
        self._lock = threading.Lock()

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self._color else text

    def print(self, text: str = "") -> None:
        with self._lock:
            self._stream.write(text + "\n")
            self._stream.flush()

    # --- hop lines --------------------------------------------------------------------------------
    def on_entry(self, entry: Entry) -> None:
        if isinstance(entry, Invocation):
            for line in self.invocation_lines(entry):
                self.print(line)
        elif isinstance(entry, Notice):
            self.print(self.notice_line(entry))
        else:
            self.print(self.publication_line(entry))

    def _prefix(self, at: float, label: str) -> str:
        stamp = datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]
        return f"{self.paint(stamp, _DIM)}  {label:<{_LABEL_WIDTH}} "

    def invocation_lines(self, invocation: Invocation) -> list[str]:
        label = short_name(invocation.function)
        result = invocation.result
        timing = self.paint(f"{result.duration_ms:.0f} ms" + (" cold" if result.cold_start else ""), _DIM)
        if invocation.trigger == "api":
            return [self._api_line(invocation, label, timing)]
        if invocation.trigger == "schedule":
            return [self._scheduled_line(invocation, label, timing)]
        records = invocation.records
        lines = []
        error = result.error
        for record in records[:_MAX_RECORD_LINES]:
            what, record_id = describe_record(record)
            record_key = record.get("messageId") or record.get("dynamodb", {}).get("SequenceNumber")
            failed = record_key in invocation.failed_ids
            if not failed:
                outcome = self.paint("ok", _GREEN)
            elif error is not None:
                outcome = self.paint(f"FAILED {error.error_type}: {error.message} (event {record_id})", _RED)
            else:
                outcome = self.paint(f"FAILED, reported for retry (event {record_id})", _RED)
            lines.append(
                f"{self._prefix(invocation.at, label)}{invocation.source}  {what}  {outcome}  {timing}"
            )
        if len(records) > _MAX_RECORD_LINES:
            more = len(records) - _MAX_RECORD_LINES
            lines.append(f"{self._prefix(invocation.at, label)}… and {more} more record(s) in this batch")
        return lines

    def _api_line(self, invocation: Invocation, label: str, timing: str) -> str:
        result = invocation.result
        payload = result.payload if isinstance(result.payload, dict) else {}
        status = payload.get("statusCode")
        request_id = invocation.event.get("requestContext", {}).get("requestId", "")
        text = f"{invocation.event.get('httpMethod')} {invocation.event.get('path')}"
        if result.error is not None:
            detail = f"502 FAILED {result.error.error_type}: {result.error.message} (request {request_id})"
            return f"{self._prefix(invocation.at, label)}{text} {self.paint(detail, _RED)}  {timing}"
        headers = {k.lower(): v for k, v in (payload.get("headers") or {}).items()}
        for name, values in (payload.get("multiValueHeaders") or {}).items():
            headers.setdefault(name.lower(), values[0] if values else "")
        location = f" → {headers['location']}" if "location" in headers else ""
        shown = f"{status}{location}"
        if not isinstance(status, int) or status >= 500:
            shown = self.paint(f"{shown} (request {request_id})", _RED)
        elif status >= 400:
            shown = self.paint(shown, _YELLOW)
        return f"{self._prefix(invocation.at, label)}{text} {shown}  {timing}"

    def _scheduled_line(self, invocation: Invocation, label: str, timing: str) -> str:
        """A scheduled run: what the function returned (the publisher's totals, say), or its error."""
        result = invocation.result
        if result.error is not None:
            outcome = self.paint(f"FAILED {result.error.error_type}: {result.error.message}", _RED)
        elif isinstance(result.payload, dict):
            outcome = " ".join(f"{k}={v}" for k, v in result.payload.items())
        else:
            outcome = self.paint("ok", _GREEN)
        return f"{self._prefix(invocation.at, label)}schedule {invocation.source}  {outcome}  {timing}"

    def notice_line(self, notice: Notice) -> str:
        colour = {"error": _RED, "warning": _YELLOW}.get(notice.level, "")
        message = self.paint(notice.message, colour) if colour else notice.message
        return f"{self._prefix(notice.at, short_name(notice.component.split('.')[0]))}{message}"

    def publication_line(self, publication: Publication) -> str:
        document = _json_object(publication.message)
        what = _summary(_cloud_event(document) or document) if document else None
        subject = f"“{publication.subject}” " if publication.subject else ""
        text = what or publication.message[:60]
        return f"{self._prefix(publication.at, publication.topic)}published {subject}{text}"
