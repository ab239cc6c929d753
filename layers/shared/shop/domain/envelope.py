"""The event envelope: CloudEvents 1.0 (JSON format) plus the extensions this system relies on.

Extensions: `sequence` (the aggregate version after the change, an integer), `correlationid`
(the originating request), `causationid` (the event that caused this one, if any), and `traceparent`
(the CloudEvents distributed-tracing extension: the W3C trace context of the write that produced the
event, for consumers outside AWS; shop.domain.tracing). A missing or malformed traceparent never
makes an event invalid: tracing is best effort.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from shop.domain.errors import EventTooLarge, InvalidEnvelope
from shop.domain.tracing import LONGEST_TRACEPARENT, from_xray_header

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"
# Fixed namespace: event ids are uuid5(namespace, source|subject|sequence|type), so a retried write
# of the same change produces the same id, and consumers dedupe on it.
_EVENT_ID_NAMESPACE = uuid.UUID("6f1c5a1e-6d2b-4f49-9a0e-2c4b0f3f8e21")
_REQUIRED = ("specversion", "id", "source", "type", "subject", "time", "data", "sequence", "correlationid")

# PutEvents counts a fixed 14 bytes for the Time field of every entry.
_ENTRY_OVERHEAD_BYTES = 14
# An envelope's own content echoed in an error's details is cut to this many characters: a poison record's
# details go with it into one poison queue message and into the relay's log line, and a record may hold
# hundreds of kilobytes in one attribute.
ECHOED_CHARACTERS = 1_000


def now() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp. RFC 3339 requires the offset: a naive time is refused, never guessed. Its
    "T" and "Z" may be lower case (RFC 3339, section 5.6). One whose UTC time falls outside years 1 to
    9999 (0001-01-01T00:00:00+01:00) is refused too: every use of it in UTC (format_time) would fail."""
    moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    if moment.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no UTC offset")
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"timestamp {text!r} is out of range in UTC (years 1 to 9999)") from None
    return moment


def echoed(value: str) -> str:
    """An envelope's value as an error's details quote it: whole, or its first ECHOED_CHARACTERS and how
    many more were cut."""
    if len(value) <= ECHOED_CHARACTERS:
        return value
    return f"{value[:ECHOED_CHARACTERS]}... ({len(value) - ECHOED_CHARACTERS} more characters cut)"


def event_id_for(source: str, subject: str, sequence: int, event_type: str) -> str:
    return str(uuid.uuid5(_EVENT_ID_NAMESPACE, f"{source}|{subject}|{sequence}|{event_type}"))


def entry_size(source: str, detail_type: str, detail: str, resources: tuple[str, ...] = ()) -> int:
    """Size of one PutEvents entry as EventBridge computes it (UTF-8 bytes)."""
    return (
        _ENTRY_OVERHEAD_BYTES
        + len(source.encode())
        + len(detail_type.encode())
        + len(detail.encode())
        + sum(len(r.encode()) for r in resources)
    )


def ensure_publishable(event: CloudEvent, max_event_bytes: int) -> None:
    """Refuse, at write time, an event that PutEvents could never accept. (What the outbox may hold, so
    shop.domain.outbox re-exports it; here, beside the size, so that the writers' import path does not
    build the outbox entry a relay reads.)"""
    size = event.entry_size()
    if size > max_event_bytes:
        raise EventTooLarge(
            "the event for this change exceeds the event bus size limit",
            {"eventBytes": size, "limitBytes": max_event_bytes},
        )


@dataclass(frozen=True, slots=True)
class CloudEvent:
    """A CloudEvents 1.0 envelope with this system's extensions (see the module's docstring)."""

    id: str
    source: str
    type: str
    subject: str
    time: str
    sequence: int
    correlationid: str
    data: dict[str, Any] = field(default_factory=dict)
    causationid: str | None = None
    traceparent: str | None = None
    specversion: str = SPEC_VERSION
    datacontenttype: str = CONTENT_TYPE

    @classmethod
    def new(
        cls,
        *,
        source: str,
        type: str,
        subject: str,
        sequence: int,
        data: dict[str, Any],
        correlation_id: str,
        causation_id: str | None = None,
        time: datetime | None = None,
    ) -> CloudEvent:
        return cls(
            id=event_id_for(source, subject, sequence, type),
            source=source,
            type=type,
            subject=subject,
            time=format_time(time or now()),
            sequence=sequence,
            correlationid=correlation_id,
            causationid=causation_id,
            data=data,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "specversion": self.specversion,
            "id": self.id,
            "source": self.source,
            "type": self.type,
            "subject": self.subject,
            "time": self.time,
            "datacontenttype": self.datacontenttype,
            "sequence": self.sequence,
            "correlationid": self.correlationid,
        }
        if self.causationid is not None:
            out["causationid"] = self.causationid
        if self.traceparent is not None:
            out["traceparent"] = self.traceparent
        out["data"] = self.data
        return out

    def with_room_for_a_trace(self) -> CloudEvent:
        """This event as large as a writer can make it: the repositories add the trace of the write
        (`traced`) when they store it, so an event checked before that is checked with a traceparent."""
        return self if self.traceparent is not None else replace(self, traceparent=LONGEST_TRACEPARENT)

    def traced(self, trace_header: str | None) -> CloudEvent:
        """This event with the trace context of an X-Ray trace header as its traceparent (unchanged when
        the header carries none)."""
        context = from_xray_header(trace_header)
        return self if context is None else replace(self, traceparent=context.traceparent)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    def entry_size(self) -> int:
        """Bytes this event takes as a PutEvents entry (Source, DetailType, Detail=the envelope)."""
        return entry_size(self.source, self.type, self.to_json())

    @classmethod
    def from_dict(cls, raw: Any) -> CloudEvent:
        if not isinstance(raw, dict):
            raise InvalidEnvelope("envelope is not a JSON object")
        missing = [name for name in _REQUIRED if name not in raw]
        if missing:
            raise InvalidEnvelope("envelope lacks required attributes", {"missing": missing})
        if raw["specversion"] != SPEC_VERSION:
            raise InvalidEnvelope("unsupported specversion", {"specversion": echoed(str(raw["specversion"]))})
        for name in ("id", "source", "type", "subject", "time", "correlationid"):
            if not isinstance(raw[name], str) or not raw[name]:
                raise InvalidEnvelope(f"attribute {name} must be a non-empty string")
        sequence = raw["sequence"]
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
            raise InvalidEnvelope("attribute sequence must be a positive integer")
        if not isinstance(raw["data"], dict):
            raise InvalidEnvelope("attribute data must be a JSON object")
        causation = raw.get("causationid")
        if causation is not None and not isinstance(causation, str):
            raise InvalidEnvelope("attribute causationid must be a string")
        try:
            parse_time(raw["time"])
        except ValueError as exc:
            raise InvalidEnvelope(
                "attribute time is not an RFC 3339 timestamp with an offset", {"time": echoed(raw["time"])}
            ) from exc
        return cls(
            id=raw["id"],
            source=raw["source"],
            type=raw["type"],
            subject=raw["subject"],
            time=raw["time"],
            sequence=sequence,
            correlationid=raw["correlationid"],
            causationid=causation,
            traceparent=raw["traceparent"] if isinstance(raw.get("traceparent"), str) else None,
            data=raw["data"],
            datacontenttype=raw.get("datacontenttype", CONTENT_TYPE),
        )

    @classmethod
    def from_json(cls, text: str) -> CloudEvent:
        try:
            raw = json.loads(text)
        except (ValueError, TypeError, RecursionError) as exc:
            # ValueError: malformed JSON, or an integer literal past Python's digit limit;
            # RecursionError: nesting deeper than the interpreter's recursion limit.
            raise InvalidEnvelope("envelope is not valid JSON", {"error": type(exc).__name__}) from exc
        return cls.from_dict(raw)
