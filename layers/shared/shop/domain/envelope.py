"""The event envelope: CloudEvents 1.0 (JSON format) plus the extensions this system relies on.

Extensions: `sequence` (the aggregate version after the change, an integer), `correlationid`
(the originating request), `causationid` (the event that caused this one, if any), and `traceparent`
(the CloudEvents distributed-tracing extension: the W3C trace context of the write that produced the
event, for consumers outside AWS; shop.domain.tracing). A missing or malformed traceparent never
makes an event invalid: tracing is best effort, a malformed one is dropped (the relay publishes the
envelope without it: shop.domain.outbox).

What CloudEvents 1.0 forbids is refused (InvalidEnvelope: a relay parks the record, a consumer
dead-letters the message): an attribute name other than lower-case a-z and 0-9, a `source` that is not a
URI-reference, a `time` that is not RFC 3339, a non-string `datacontenttype` or a `dataschema` that is no
absolute URI, and `data_base64` (this system's events carry JSON data only).
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any, NamedTuple

from shop.domain.errors import EventTooLarge, InvalidEnvelope
from shop.domain.tracing import LONGEST_TRACEPARENT, from_traceparent, from_xray_header

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"
# Fixed namespace: event ids are uuid5(namespace, source|subject|sequence|type), so a retried write
# of the same change produces the same id, and consumers dedupe on it.
_EVENT_ID_NAMESPACE = uuid.UUID("6f1c5a1e-6d2b-4f49-9a0e-2c4b0f3f8e21")
_REQUIRED = ("specversion", "id", "source", "type", "subject", "time", "data", "sequence", "correlationid")

# CloudEvents 1.0, "Attribute Naming Convention": lower-case ASCII letters and digits only. (It also says
# names SHOULD NOT exceed 20 characters: a SHOULD, so a longer one is not refused.)
_ATTRIBUTE_NAME = re.compile(r"[a-z0-9]+", re.ASCII)
# RFC 3339's date-time (section 5.6): full-date "T" full-time, seconds required, "." before the fraction, an
# offset of Z or +hh:mm/-hh:mm (optional here only to name its absence); "T" and "Z" in either case (5.6's
# note). fromisoformat alone also takes ISO 8601 forms RFC 3339 excludes (20240101T000000Z, 2024-01-01T00Z,
# 2024-01-01T00:00Z, a comma before the fraction, a space for the "T"). A leap second (:60) matches this
# but no datetime holds it: refused.
_RFC3339_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?([Zz]|[+-]\d{2}:\d{2})?", re.ASCII
)
# RFC 3986's characters of a URI-reference: unreserved, sub-delims, gen-delims (":/?#[]@"), and "%" only
# as the percent-encoding of an octet (two hex digits). Not checked: where "[" and "]" may stand (an
# IP-literal host) and the authority's own syntax.
_URI_CHARACTERS = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:/?#\[\]@]|%[0-9A-Fa-f]{2})*", re.ASCII)
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*", re.ASCII)

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
    "T" and "Z" may be lower case (RFC 3339, section 5.6). The other ISO 8601 forms Python's fromisoformat
    takes are refused, and so is a leap second (23:59:60Z: a datetime cannot hold it). One whose UTC time
    falls outside years 1 to 9999 (0001-01-01T00:00:00+01:00) is refused too: every use of it in UTC
    (format_time) would fail."""
    found = _RFC3339_DATE_TIME.fullmatch(text)
    if found is None:
        raise ValueError(f"timestamp {text[:100]!r} is not an RFC 3339 date-time")
    if found.group(1) is None:
        raise ValueError(f"timestamp {text!r} has no UTC offset")
    moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"timestamp {text!r} is out of range in UTC (years 1 to 9999)") from None
    return moment


def is_uri_reference(text: str) -> bool:
    """Whether `text` is an RFC 3986 URI-reference, as far as _URI_CHARACTERS goes: its characters, at most
    one "#" (the fragment has none), and a ":" before the first "/", "?" or "#" only after a valid scheme
    (a relative reference's first segment holds none)."""
    if not _URI_CHARACTERS.fullmatch(text) or text.count("#") > 1:
        return False
    head = re.split(r"[/?#]", text, maxsplit=1)[0]
    return ":" not in head or bool(_URI_SCHEME.fullmatch(head.split(":", 1)[0]))


def is_absolute_uri(text: str) -> bool:
    """Whether `text` is a URI-reference with a scheme (CloudEvents' URI type: RFC 3986 section 4.3)."""
    head = re.split(r"[/?#]", text, maxsplit=1)[0]
    return is_uri_reference(text) and ":" in head


def echoed(value: str) -> str:
    """An envelope's value as an error's details quote it: whole, or its first ECHOED_CHARACTERS and how
    many more were cut."""
    if len(value) <= ECHOED_CHARACTERS:
        return value
    return f"{value[:ECHOED_CHARACTERS]}... ({len(value) - ECHOED_CHARACTERS} more characters cut)"


def valid_traceparent(value: Any) -> str | None:
    """`value` if it is a valid W3C traceparent (shop.domain.tracing), else None: tracing is best effort, so
    a malformed one is dropped, never a reason to refuse the event."""
    return value if isinstance(value, str) and from_traceparent(value) is not None else None


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


class CloudEvent(NamedTuple):
    """A CloudEvents 1.0 envelope with this system's extensions (see the module's docstring)."""

    id: str
    source: str
    type: str
    subject: str
    time: str
    sequence: int
    correlationid: str
    data: dict[str, Any]
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
        return self if self.traceparent is not None else self._replace(traceparent=LONGEST_TRACEPARENT)

    def traced(self, trace_header: str | None) -> CloudEvent:
        """This event with the trace context of an X-Ray trace header as its traceparent (unchanged when
        the header carries none)."""
        context = from_xray_header(trace_header)
        return self if context is None else self._replace(traceparent=context.traceparent)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    def entry_size(self) -> int:
        """Bytes this event takes as a PutEvents entry (Source, DetailType, Detail=the envelope)."""
        return entry_size(self.source, self.type, self.to_json())

    @classmethod
    def from_dict(cls, raw: Any) -> CloudEvent:
        if not isinstance(raw, dict):
            raise InvalidEnvelope("envelope is not a JSON object")
        if "data_base64" in raw:
            raise InvalidEnvelope("attribute data_base64: this system's events carry JSON data only")
        badly_named = [name for name in raw if name != "data" and not _ATTRIBUTE_NAME.fullmatch(name)]
        if badly_named:
            raise InvalidEnvelope(
                "attribute names must be lower-case letters and digits",
                {"names": echoed(", ".join(badly_named))},
            )
        missing = [name for name in _REQUIRED if name not in raw]
        if missing:
            raise InvalidEnvelope("envelope lacks required attributes", {"missing": missing})
        if raw["specversion"] != SPEC_VERSION:
            raise InvalidEnvelope("unsupported specversion", {"specversion": echoed(str(raw["specversion"]))})
        for name in ("id", "source", "type", "subject", "time", "correlationid"):
            if not isinstance(raw[name], str) or not raw[name]:
                raise InvalidEnvelope(f"attribute {name} must be a non-empty string")
        if not is_uri_reference(raw["source"]):
            raise InvalidEnvelope(
                "attribute source is not a URI-reference (RFC 3986)", {"source": echoed(raw["source"])}
            )
        # JSON format: an attribute whose value is null is absent.
        content_type = raw.get("datacontenttype")
        if content_type is not None and (not isinstance(content_type, str) or not content_type):
            raise InvalidEnvelope("attribute datacontenttype must be a non-empty string")
        schema = raw.get("dataschema")
        if schema is not None and (not isinstance(schema, str) or not is_absolute_uri(schema)):
            raise InvalidEnvelope("attribute dataschema must be an absolute URI")
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
            traceparent=valid_traceparent(raw.get("traceparent")),
            data=raw["data"],
            datacontenttype=content_type or CONTENT_TYPE,
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
