"""Hops: what each piece of the saga did, built from the stack's activity log, for one order's waterfall.

A hop is one piece of work on one event (or request): the API handling a request, the relay publishing
an outbox record, a consumer handling a message, a message published to an SNS topic. An invocation of
a batch is one hop per record, all with the invocation's start and duration. Hops are keyed by what the
CloudEvents envelope carries (shop/domain/envelope.py): the event id, the order (the event's subject, or
the order the outbox item's key names when the envelope cannot be read), the correlation id of the
request that started the saga, and the event that caused it (causation id). The API's hop gets the order
from its path or its answer, and the correlation id from its X-Correlation-Id answer header.

A hop may have a parent hop (`parent`, a hop id): the page indents a hop under its parent and draws
every bar from its start and duration alone. Parents come from the same trace headers X-Ray reads
(docs/operations.md, "One trace per saga"), on every order store alike (order_timeline):
- the publication of an event (the stream relay's record, or the PostgreSQL outbox row the polling
  publisher or the logical relay sent) continues the trace its envelope's traceparent names: the writer's,
  the order API's for the whole saga (a consumer's write carries its message's trace on). Its parent is
  the hop that ran in that trace segment;
- a consumer's invocation is linked (X-Ray: "automatically linked") to the trace its message's
  AWSTraceHeader names, which is the one that publication put on the bus: its parent is the publication
  of the same event in that trace, marked `linked` (the hop of the trace segment itself when the
  timeline holds no publication of it, e.g. a record published again by an operator command);
- an SNS publication's parent is the consumer invocation that published it (it happened inside it).

What the functions said about each record in their log lines (the stack's FunctionReports: an event
applied or ignored, why a message failed, why a record was parked) comes with the entries as notices
(report_notice) and is set on the hops it names.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shop.adapters.dynamodb import keys as table_keys
from shop.domain.serialization import camel_fields
from shop.domain.tracing import TraceContext, from_traceparent, from_xray_header
from tools.local.console.activity import Entry, Invocation, Notice, Publication

Outcome = Literal["ok", "ignored", "failed", "parked", "pending"]
PUBLICATIONS = frozenset({"dynamodb", "outbox"})  # the triggers of hops that put an event on the bus
_NO_TRACE = TraceContext("", "", sampled=False)
CORRELATION_HEADER = "x-correlation-id"
# Hop fields its JSON shows in another form (Hop.to_json).
_SHOWN_OTHERWISE = ("started_at", "duration_ms", "keys", "trace", "continues", "links_to", "record_id")


@dataclass(frozen=True)
class EventKeys:
    """What an event says about itself: from its CloudEvents envelope, else from the outbox item."""

    event_id: str | None = None
    event_type: str | None = None
    order_id: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None


@dataclass(frozen=True)
class Hop:
    id: str
    function: str  # logical id of the function (or the topic, for a publication)
    trigger: str  # api, dynamodb, sqs, sns, direct, outbox
    source: str  # route, table, queue or topic
    started_at: float  # epoch seconds
    duration_ms: float
    outcome: Outcome
    keys: EventKeys = field(default_factory=EventKeys)
    parent: str | None = None
    attempt: int = 1  # 1 for the first time this function met this event
    error: str | None = None
    detail: str = ""  # what the hop did, in a few words (a request's method, path and status)
    batch_size: int = 1
    cold_start: bool = False
    request_id: str = ""
    depth: int = 0  # how far under its parent chain the page indents it (set by order_timeline)
    trace: TraceContext | None = None  # the trace segment it ran in (an API invocation's own header)
    continues: TraceContext | None = None  # the trace it continues (a publication's envelope traceparent)
    links_to: TraceContext | None = None  # the trace it is linked to (a consumed message's AWSTraceHeader)
    relation: Literal["child", "linked"] | None = None  # how it hangs under its parent (set with it)
    record_id: str = ""  # the record's id in its batch (SQS message id, stream sequence number)
    result: str | None = None  # what the function said it did with the event ("reserved", "ignored:...")

    @property
    def retries(self) -> int:
        return self.attempt - 1

    @property
    def ended_at(self) -> float:
        return self.started_at + self.duration_ms / 1000

    def to_json(self) -> dict[str, Any]:
        """Its fields in camelCase, its event's keys among them; its times in milliseconds, its trace
        contexts as one trace id."""
        return {
            **camel_fields(self, omit=_SHOWN_OTHERWISE),
            **camel_fields(self.keys),
            "startMs": round(self.started_at * 1000, 3),
            "durationMs": round(self.duration_ms, 3),
            "retries": self.retries,
            "traceId": (self.trace or self.continues or self.links_to or _NO_TRACE).trace_id or None,
            "recordId": self.record_id or None,
        }


# --- reading what the records carry -------------------------------------------------------------------
def _json_object(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, str):
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def envelope_keys(envelope: dict[str, Any] | None) -> EventKeys:
    if envelope is None:
        return EventKeys()
    return EventKeys(
        event_id=_text(envelope.get("id")),
        event_type=_text(envelope.get("type")),
        order_id=_text(envelope.get("subject")),
        correlation_id=_text(envelope.get("correlationid")),
        causation_id=_text(envelope.get("causationid")),
    )


def _string_attribute(image: dict[str, Any], name: str) -> str | None:
    value = image.get(name)
    return _text(value.get("S")) if isinstance(value, dict) else None


def outbox_image_keys(image: dict[str, Any]) -> EventKeys:
    """An outbox item's event: its envelope (shop/adapters/dynamodb/outbox_items.py), else (a poison
    item's envelope being unreadable) the eventId, eventType and aggregateId attributes an item written
    by earlier code carries, else its key: the event id its sort key ends with, the order its partition
    key names (shop/adapters/dynamodb/keys.py)."""
    keys = envelope_keys(_json_object(_string_attribute(image, "envelope")))
    sort_key, partition = _string_attribute(image, table_keys.SK), _string_attribute(image, table_keys.PK)
    return EventKeys(
        event_id=keys.event_id
        or _string_attribute(image, "eventId")
        or (table_keys.outbox_event_id(sort_key) if sort_key else None),
        event_type=keys.event_type or _string_attribute(image, "eventType"),
        order_id=keys.order_id
        or _string_attribute(image, "aggregateId")
        or (table_keys.outbox_aggregate_id(partition) if partition else None),
        correlation_id=keys.correlation_id,
        causation_id=keys.causation_id,
    )


def message_keys(body: Any) -> EventKeys:
    """A queue message's event: an EventBridge event (rule target) carrying the envelope as its detail."""
    document = _json_object(body)
    if document is None:
        return EventKeys()
    detail = document.get("detail")
    if isinstance(detail, dict):
        keys = envelope_keys(detail)
        return replace(
            keys,
            event_id=keys.event_id or _text(document.get("id")),
            event_type=keys.event_type or _text(document.get("detail-type")),
        )
    return envelope_keys(document) if "specversion" in document else EventKeys()


def _record_key(record: dict[str, Any]) -> str:
    """The id a function reports a record's failure by (and the poller records in failed_ids)."""
    if "dynamodb" in record:
        return str(record["dynamodb"].get("SequenceNumber", ""))
    return str(record.get("messageId", ""))


def _record_keys(record: dict[str, Any]) -> EventKeys:
    if "dynamodb" in record:
        data = record["dynamodb"]
        image = data.get("NewImage") or data.get("OldImage") or {}
        return outbox_image_keys(image) if isinstance(image, dict) else EventKeys()
    return message_keys(record.get("body"))


def _receive_count(record: dict[str, Any]) -> int | None:
    try:
        return int(record.get("attributes", {}).get("ApproximateReceiveCount"))
    except (TypeError, ValueError):
        return None


def _error_text(invocation: Invocation) -> str | None:
    error = invocation.result.error
    return f"{error.error_type}: {error.message}" if error is not None else None


def _started_at(invocation: Invocation) -> float:
    """When the invocation started: the runtime's clock, else its end (the entry's time) less its duration."""
    result = invocation.result
    return result.started_at or invocation.at - result.duration_ms / 1000


# --- hops from activity entries -----------------------------------------------------------------------
def _api_hop(invocation: Invocation) -> Hop:
    event = invocation.event if isinstance(invocation.event, dict) else {}
    result = invocation.result
    payload = result.payload if isinstance(result.payload, dict) else {}
    headers = {str(k).lower(): v for k, v in (payload.get("headers") or {}).items()}
    for name, values in (payload.get("multiValueHeaders") or {}).items():
        if values:
            headers.setdefault(str(name).lower(), values[0])
    status = payload.get("statusCode")
    body = _json_object(payload.get("body")) or {}
    order_id = _text((event.get("pathParameters") or {}).get("orderId")) or _text(body.get("orderId"))
    request_id = str((event.get("requestContext") or {}).get("requestId") or result.request_id)
    failed = result.error is not None or not isinstance(status, int) or status >= 500
    shown_status = status if isinstance(status, int) else 502
    return Hop(
        id=f"api/{request_id}",
        function=invocation.function,
        trigger="api",
        source=invocation.source,
        started_at=_started_at(invocation),
        duration_ms=result.duration_ms,
        outcome="failed" if failed else "ok",
        keys=EventKeys(order_id=order_id, correlation_id=_text(headers.get(CORRELATION_HEADER))),
        error=_error_text(invocation) or (f"HTTP {shown_status}" if failed else None),
        detail=f"{event.get('httpMethod', '?')} {event.get('path', '?')} {shown_status}",
        cold_start=result.cold_start,
        request_id=request_id,
        trace=from_xray_header(result.trace_header),
    )


def _record_hops(invocation: Invocation) -> list[Hop]:
    records = invocation.records
    result = invocation.result
    hops = []
    for record in records:
        key = _record_key(record)
        keys = _record_keys(record)
        error = None
        outcome: Outcome = "ok"
        if key in invocation.failed_ids:
            outcome = "failed"
            error = _error_text(invocation) or "reported as failed (batchItemFailures): retried"
        receive_count = _receive_count(record) if invocation.trigger == "sqs" else None
        hops.append(
            Hop(
                id=f"{invocation.trigger}/{result.request_id}/{key}",
                function=invocation.function,
                trigger=invocation.trigger,
                source=invocation.source,
                started_at=_started_at(invocation),
                duration_ms=result.duration_ms,
                outcome=outcome,
                keys=keys,
                attempt=receive_count or 0,  # 0: counted below, from earlier invocations
                error=error,
                detail=keys.event_type or "",
                batch_size=len(records),
                cold_start=result.cold_start,
                request_id=result.request_id,
                record_id=key,
                continues=_continued_trace(invocation.trigger, record),
                links_to=_linked_trace(invocation.trigger, record),
            )
        )
    return hops


def _continued_trace(trigger: str, record: dict[str, Any]) -> TraceContext | None:
    """A stream record's publication continues the trace its envelope's traceparent names."""
    if trigger != "dynamodb":
        return None
    image = (record.get("dynamodb") or {}).get("NewImage") or {}
    envelope = _json_object((image.get("envelope") or {}).get("S")) if isinstance(image, dict) else None
    return from_traceparent(_text((envelope or {}).get("traceparent")))


def _linked_trace(trigger: str, record: dict[str, Any]) -> TraceContext | None:
    """A message's handling is linked to the trace of its AWSTraceHeader."""
    if trigger != "sqs":
        return None
    return from_xray_header((record.get("attributes") or {}).get("AWSTraceHeader"))


def _publication_hop(publication: Publication) -> Hop:
    message = _json_object(publication.message) or {}
    event_id = _text(message.get("eventId")) or _text(publication.attributes.get("eventId", {}).get("Value"))
    return Hop(
        id=f"sns/{publication.message_id or publication.at}",
        function=publication.topic,
        trigger="sns",
        source=publication.topic,
        started_at=publication.at,
        duration_ms=0.0,
        outcome="ok",
        keys=EventKeys(
            event_id=event_id, event_type=_text(message.get("type")), order_id=_text(message.get("orderId"))
        ),
        detail=f"published {message.get('type') or 'a message'}",
        record_id=publication.message_id,
    )


def entry_hops(entry: Entry) -> list[Hop]:
    """The hops one activity entry holds, as it stands alone (attempts, parents and parking come from
    the others: build_hops)."""
    if isinstance(entry, Invocation):
        if entry.trigger == "api":
            return [_api_hop(entry)]
        if entry.trigger in {"dynamodb", "sqs", "direct"}:
            return _record_hops(entry)
        # Scheduled runs (the PostgreSQL outbox publisher) carry no records: their events are read from
        # the outbox table instead (outbox_row_hop).
        return []
    if isinstance(entry, Publication):
        return [_publication_hop(entry)]
    return []


class HopCache:
    """Each entry's hops, read once: entries never change, and the page asks for a timeline every second
    (reading 10,000 entries' records takes about half a second)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hops: dict[int, tuple[Entry, list[Hop]]] = {}

    def hops(self, entries: Iterable[Entry]) -> list[Hop]:
        with self._lock:
            known, current = self._hops, {}
            for entry in entries:
                cached = known.get(id(entry))
                # The entry is kept with its hops, so its id cannot be reused while it is cached.
                current[id(entry)] = cached if cached is not None else (entry, entry_hops(entry))
            self._hops = current  # entries the activity log has dropped are forgotten
        return [hop for _, hops in current.values() for hop in hops]


def build_hops(
    entries: Iterable[Entry], parked: frozenset[str] = frozenset(), cache: HopCache | None = None
) -> list[Hop]:
    """Every hop the entries hold, in start order, with what the functions said about each record,
    attempts counted and SNS publications' parents set (trace parents: order_timeline).

    `parked`: event ids in the relay poison queue (the relay's invocation itself succeeds when it parks)."""
    entries = list(entries)
    if cache is not None:
        hops = cache.hops(entries)
    else:
        hops = [hop for entry in entries for hop in entry_hops(entry)]
    hops = [
        replace(hop, outcome="parked", error="parked in the relay poison queue")
        if hop.trigger == "dynamodb" and hop.outcome == "ok" and hop.keys.event_id in parked
        else hop
        for hop in hops
    ]
    hops = _with_reports(hops, record_facts(entries))
    hops.sort(key=lambda hop: hop.started_at)
    return _with_publication_parents(_with_attempts(hops))


# --- what the functions said about each record (tools/local/console/reports.py) ------------------------
REPORT_SOURCE = "function report"  # a Notice's details["source"] when it carries a function's report
_REPORT_FIELDS = ("kind", "detail", "event_id", "message_id", "sequence_number")


def report_notice(function: str, request_id: str, report: Any) -> Notice:
    """A function's report on one record of an invocation (a console.reports.RecordReport) as the notice
    the timeline reads it from."""
    fields = {name: getattr(report, name, None) for name in _REPORT_FIELDS}
    return Notice(
        "info",
        function,
        f"record {fields['kind']}",
        {"source": REPORT_SOURCE, "request_id": request_id, **fields},
    )


@dataclass(frozen=True)
class RecordFacts:
    """The reports by invocation (request id)."""

    by_request: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def about(self, hop: Hop) -> list[dict[str, Any]]:
        """The reports on the hop's record: by message id or sequence number, else by its event id."""
        return [report for report in self.by_request.get(hop.request_id, []) if _concerns(report, hop)]


def _concerns(report: dict[str, Any], hop: Hop) -> bool:
    record_id = report.get("message_id") or report.get("sequence_number")
    if record_id is not None:
        return bool(record_id == hop.record_id)
    return report.get("event_id") is not None and report.get("event_id") == hop.keys.event_id


def record_facts(entries: Iterable[Entry]) -> RecordFacts:
    facts = RecordFacts()
    for entry in entries:
        if isinstance(entry, Notice) and entry.details.get("source") == REPORT_SOURCE:
            facts.by_request.setdefault(str(entry.details.get("request_id")), []).append(entry.details)
    return facts


def _with_reports(hops: list[Hop], facts: RecordFacts) -> list[Hop]:
    """Each record hop told what its function said of it: ignored (a consumer that applied nothing),
    what it applied, why it failed, why it was parked."""
    told = []
    for hop in hops:
        if hop.trigger in {"sqs", "dynamodb"}:
            for report in facts.about(hop):
                kind, detail = report.get("kind"), str(report.get("detail") or "")
                if kind == "ignored" and hop.outcome == "ok":
                    hop = replace(
                        hop, outcome="ignored", result=f"ignored: {detail}" if detail else "ignored"
                    )
                elif kind == "applied" and hop.outcome == "ok":
                    hop = replace(hop, result=detail or None)
                elif kind == "failed" and hop.outcome == "failed" and detail:
                    hop = replace(hop, error=detail)
                elif kind == "parked" and hop.outcome in {"ok", "parked"}:
                    hop = replace(
                        hop,
                        outcome="parked",
                        error=f"parked in the relay poison queue: {detail}".rstrip(": "),
                    )
        told.append(hop)
    return told


# --- parents from trace context -------------------------------------------------------------------------
def _segment(context: TraceContext) -> tuple[str, str]:
    return context.trace_id, context.parent_id


def _with_trace_parents(hops: list[Hop]) -> list[Hop]:
    """Parents from trace headers. A publication continues the trace segment its envelope names: it hangs
    under the hop that ran in it (the order API's invocation, for every event of its saga). A consumer's
    invocation is linked to the trace context on its message, which the publication of its event put on
    the bus: it hangs under that publication (the latest of that event in that context to start before
    it, one that succeeded if any did), else under the hop of the segment itself."""
    by_segment = {_segment(hop.trace): hop.id for hop in hops if hop.trace is not None}
    publications: dict[tuple[str, str, str], list[Hop]] = defaultdict(list)
    for hop in hops:
        if hop.trigger in PUBLICATIONS and hop.continues is not None and hop.keys.event_id is not None:
            publications[(hop.keys.event_id, *_segment(hop.continues))].append(hop)
    placed = []
    for hop in hops:
        if hop.parent is None and hop.continues is not None:
            parent = by_segment.get(_segment(hop.continues))
            if parent is not None and parent != hop.id:
                hop = replace(hop, parent=parent, relation="child")
        elif hop.parent is None and hop.links_to is not None:
            sent = publications.get((hop.keys.event_id or "", *_segment(hop.links_to)), [])
            earlier = [p for p in sent if p.started_at <= hop.started_at and p.id != hop.id]
            delivered = [p for p in earlier if p.outcome == "ok"] or earlier
            parent = delivered[-1].id if delivered else by_segment.get(_segment(hop.links_to))
            if parent is not None and parent != hop.id:
                hop = replace(hop, parent=parent, relation="linked")
        placed.append(hop)
    return placed


def _with_attempts(hops: list[Hop]) -> list[Hop]:
    """A record hop's attempt: its message's receive count (SQS), else 1 + the earlier invocations of the
    same function with the same event (a stream batch retried or bisected)."""
    seen: dict[tuple[str, str], int] = defaultdict(int)
    counted = []
    for hop in hops:
        if hop.trigger in {"api", "sns"} or hop.keys.event_id is None:
            counted.append(hop if hop.attempt else replace(hop, attempt=1))
            continue
        key = (hop.function, hop.keys.event_id)
        seen[key] += 1
        counted.append(hop if hop.attempt else replace(hop, attempt=seen[key]))
    return counted


def _with_publication_parents(hops: list[Hop]) -> list[Hop]:
    """A publication's parent: the consumer invocation of its event that says it published it (the
    notification consumer reports "notified:<the SNS message id>"); else, as several consumers may
    handle one event (OrderCancelled: inventory and notification), the one of them that was running
    when it was published (else the last one that started before it). Its correlation id comes with it."""
    handlers: dict[str, list[Hop]] = defaultdict(list)
    for hop in hops:
        if hop.trigger == "sqs" and hop.keys.event_id is not None:
            handlers[hop.keys.event_id].append(hop)
    placed = []
    for hop in hops:
        if hop.trigger != "sns" or hop.keys.event_id is None:
            placed.append(hop)
            continue
        candidates = [h for h in handlers.get(hop.keys.event_id, []) if h.started_at <= hop.started_at]
        publisher = [h for h in candidates if hop.record_id and h.result and hop.record_id in h.result]
        running = [h for h in candidates if hop.started_at <= h.ended_at]
        if not candidates:
            placed.append(hop)
            continue
        parent = (publisher or running or candidates)[-1]
        keys = replace(hop.keys, correlation_id=parent.keys.correlation_id)
        placed.append(replace(hop, parent=parent.id, keys=keys))
    return placed


def outbox_row_hop(row: dict[str, Any], consumed: frozenset[str]) -> Hop:
    """A row of the PostgreSQL order store's outbox as the relay hop of its event: from the commit
    (created_at) to the bus (published_at, set by the polling publisher). The logical relay records no
    publish time: a row a consumer has handled since is on the bus, with no duration to show."""
    keys = envelope_keys(row.get("envelope") if isinstance(row.get("envelope"), dict) else None)
    keys = replace(
        keys,
        event_id=keys.event_id or _text(row.get("event_id")),
        event_type=keys.event_type or _text(row.get("event_type")),
        order_id=keys.order_id or _text(row.get("aggregate_id")),
    )
    created = float(row["created_at"])
    published, parked_at = row.get("published_at"), row.get("parked_at")
    outcome: Outcome = "ok"
    error = None
    duration = 0.0
    detail = keys.event_type or ""
    if parked_at is not None:
        outcome, error = "parked", f"parked in the relay poison queue: {row.get('last_error') or ''}".strip()
        duration = (float(parked_at) - created) * 1000
    elif published is not None:
        duration = (float(published) - created) * 1000
    elif keys.event_id in consumed:
        detail = f"{detail} (on the bus; the logical relay records no publish time)".strip()
    else:
        outcome = "pending"
        error = str(row["last_error"]) if row.get("last_error") else None
    attempts = int(row.get("attempts") or 0)
    return Hop(
        id=f"outbox/{row.get('position')}",
        function="OutboxPublisherFunction",
        trigger="outbox",
        source="outbox table",
        started_at=created,
        duration_ms=max(duration, 0.0),
        outcome=outcome,
        keys=keys,
        attempt=max(attempts, 1),
        error=error,
        detail=detail,
        continues=from_traceparent(_text((row.get("envelope") or {}).get("traceparent")))
        if isinstance(row.get("envelope"), dict)
        else None,
    )


# --- one order ---------------------------------------------------------------------------------------
def order_timeline(hops: Iterable[Hop], order_id: str) -> list[Hop]:
    """The order's hops: those of its events, its API requests, and hops that name no order but share a
    correlation id with it. Rows as a trace waterfall lists spans: by start, each hop followed by its
    children (by start, at one more level of depth); a hop whose parent is not among them is a root.
    Parents from trace context: _with_trace_parents."""
    hops = list(hops)
    mine = [hop for hop in hops if hop.keys.order_id == order_id]
    correlations = {hop.keys.correlation_id for hop in mine} - {None}
    mine += [hop for hop in hops if hop.keys.order_id is None and hop.keys.correlation_id in correlations]
    mine.sort(key=lambda hop: hop.started_at)
    # Parents here, not in build_hops: a PostgreSQL outbox row's hop (outbox_row_hop) is made apart from
    # the entries' hops, and is a publication the consumers hang under like the stream relay's.
    mine = _with_trace_parents(mine)
    ids = {hop.id for hop in mine}
    children: dict[str | None, list[Hop]] = defaultdict(list)
    for hop in mine:
        children[hop.parent if hop.parent in ids else None].append(hop)
    rows: list[Hop] = []
    placed: set[str] = set()

    def place(hop: Hop, depth: int) -> None:
        if hop.id in placed:  # trace data could hold a cycle: each hop is shown once
            return
        placed.add(hop.id)
        rows.append(replace(hop, depth=depth))
        for child in children.get(hop.id, []):
            place(child, depth + 1)

    for root in children[None]:
        place(root, 0)
    for hop in mine:  # hops only reachable through a cycle
        place(hop, 0)
    return rows
