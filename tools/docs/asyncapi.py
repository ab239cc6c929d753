"""docs/asyncapi.yaml (AsyncAPI 3.0) and the event table of docs/events.md.

- the channel is the template's event bus; its address follows the bus's Name (`Fn::Sub` of parameters
  becomes channel parameters with the parameters' defaults);
- one message per event type of shop.domain.event_types; its payload is the CloudEvents envelope as
  shop.domain.envelope.CloudEvent writes it (attributes, their types and which are always present are read
  from the code: a sample event's `to_dict()` and the dataclass's annotations) with `source` and
  `type` fixed and `data` the type's declared schema;
- operations: the relay (the function whose code may put events on the bus) sends every message; each
  EventBridge rule on the bus receives the messages its pattern's `source` and `detail-type` select.
"""

from __future__ import annotations

import re
import typing
from typing import Any, get_type_hints

import yaml

from tools.docs.cfn import ExpandedTemplate, TemplateError, reference
from tools.docs.domain import CONTENT_TYPE, EVENT_TYPES, SPEC_VERSION, CloudEvent, EventType
from tools.docs.reference import cell, table, ticked
from tools.docs.schema import SCHEMAS_PATH, SchemaBuilder

ASYNCAPI_VERSION = "3.0.0"
# The contract's version (semantic versioning, as docs/events.md "How the contract evolves" says): 1.1.0
# for what was added to 1.0.0 (traceparent, OrderRejected's rejection, InventoryRejected's unknownSkus, the
# envelope open to extension attributes).
DOCUMENT_VERSION = "1.1.0"
CHANNEL = "eventBus"
ENVELOPE = "CloudEventEnvelope"

# What each envelope attribute means; a new attribute of CloudEvent stops the generator until it is here.
ATTRIBUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "specversion": ("CloudEvents specification version.", {"const": SPEC_VERSION}),
    "id": (
        "uuid5(source|subject|sequence|type): a retried write of the same change has the same id; "
        "consumers deduplicate on it.",
        {"format": "uuid"},
    ),
    "source": ("The bounded context that emitted the event; EventBridge's source.", {}),
    "type": ("The event type; EventBridge's detail-type.", {}),
    "subject": ("The aggregate the event is about (the order id).", {}),
    "time": ("When the change happened (RFC 3339, UTC, milliseconds).", {"format": "date-time"}),
    "datacontenttype": ("Media type of data.", {"const": CONTENT_TYPE}),
    "sequence": (
        "Extension: the aggregate's version after the change (the order's for order events, the "
        "reservation's for inventory events). An integer, compared as one: not CloudEvents' documented "
        "Sequence extension (a string ordered lexicographically).",
        {"minimum": 1},
    ),
    "correlationid": ("Extension: the request that started the saga (X-Correlation-Id).", {}),
    "causationid": ("Extension: the id of the event that caused this one; absent on API-made events.", {}),
    "traceparent": (
        "Extension (CloudEvents distributed tracing): the W3C trace context of the write that produced the "
        "event, from its X-Ray trace (one trace id for a whole saga); absent when the writer was not traced.",
        {"pattern": "^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"},
    ),
    "data": ("The event's data; its schema depends on type.", {}),
}
_JSON_TYPES = {str: "string", int: "integer", dict: "object"}


def _sample_envelope() -> dict[str, Any]:
    """An envelope as the code writes it, with every optional attribute set, for its attribute order."""
    return (
        CloudEvent.new(
            source="sample",
            type="Sample",
            subject="sample",
            sequence=1,
            data={},
            correlation_id="sample",
            causation_id="sample",
        )
        .traced("Root=1-00000001-000000000000000000000001;Parent=0000000000000001;Sampled=1")
        .to_dict()
    )


def envelope_schema() -> dict[str, Any]:
    hints = get_type_hints(CloudEvent)
    written = list(_sample_envelope())
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name in written:
        if name not in ATTRIBUTES:
            raise TemplateError(
                f"envelope attribute {name!r}: describe it in tools/docs/asyncapi.py ATTRIBUTES"
            )
        hint = hints[name]
        optional = type(None) in typing.get_args(hint)
        base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint
        json_type = _JSON_TYPES[typing.get_origin(base) or base]
        description, keywords = ATTRIBUTES[name]
        properties[name] = {"type": json_type, "description": description, **keywords}
        if not optional:
            required.append(name)
    return {
        "type": "object",
        "description": "A CloudEvents 1.0 envelope (JSON format) with this system's extensions. "
        "On EventBridge: Source = source, DetailType = type, Detail = the whole envelope.",
        "required": required,
        "properties": properties,
        # Open to extension attributes, as CloudEvents is: a consumer ignores those it does not know. Their
        # names and values as CloudEvents 1.0 allows them (a value of its types, all strings, integers or
        # booleans in the JSON format).
        "propertyNames": {"pattern": "^[a-z0-9]+$"},
        "additionalProperties": {
            "type": ["string", "integer", "boolean"],
            "description": "An extension attribute this document does not list: consumers ignore it.",
        },
    }


def received_by(template: ExpandedTemplate) -> dict[str, dict[str, Any]]:
    """Rule -> what it receives (event type names), its target queue and the function that consumes it."""
    found: dict[str, dict[str, Any]] = {}
    for rule, props in template.rules_on_bus().items():
        pattern = props.get("EventPattern", {})
        sources, detail_types = pattern.get("source"), pattern.get("detail-type")
        if set(pattern) - {"source", "detail-type"} or not all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in (sources, detail_types or [])
        ):
            raise TemplateError(f"{rule}: only patterns of plain source and detail-type lists are documented")
        types = [
            e.name
            for e in EVENT_TYPES
            if e.source in sources and (detail_types is None or e.name in detail_types)
        ]
        unknown = set(detail_types or []) - {e.name for e in EVENT_TYPES}
        if unknown:
            raise TemplateError(f"{rule} matches event types the domain does not declare: {sorted(unknown)}")
        targets = [reference(t.get("Arn")) for t in props.get("Targets", [])]
        queues = [t for t in targets if t]
        consumers = [c for c in (template.consumer_of_queue(q) for q in queues) if c]
        found[rule] = {
            "types": types,
            "pattern": pattern,
            "description": props.get("Description", ""),
            "queues": queues,
            "consumers": consumers,
        }
    return found


def _channel_address(template: ExpandedTemplate) -> tuple[str, dict[str, Any]]:
    """The bus name, with the template parameters it is made of as AsyncAPI channel parameters."""
    written = template.raw.get("Resources", {}).get(template.event_bus, {}).get("Properties", {}).get("Name")
    if isinstance(written, dict) and set(written) == {"Fn::Sub"} and isinstance(written["Fn::Sub"], str):
        names = re.findall(r"\$\{([A-Za-z0-9]+)\}", written["Fn::Sub"])
        declared = template.raw.get("Parameters", {})
        if names and all(n in declared for n in names):
            parameters = {
                n: {"description": " ".join(str(declared[n].get("Description", n)).split())}
                | ({"default": str(declared[n]["Default"])} if "Default" in declared[n] else {})
                for n in names
            }
            return re.sub(r"\$\{([A-Za-z0-9]+)\}", r"{\1}", written["Fn::Sub"]), parameters
    return str(template.properties(template.event_bus).get("Name", template.event_bus)), {}


def _message(event: EventType, data_ref: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": event.name,
        "title": event.name,
        "summary": event.summary,
        "contentType": CONTENT_TYPE,
        "correlationId": {
            "description": "The request that started the saga",
            "location": "$message.payload#/correlationid",
        },
        "payload": {
            "allOf": [
                {"$ref": SCHEMAS_PATH + ENVELOPE},
                {
                    "type": "object",
                    "properties": {
                        "source": {"const": event.source},
                        "type": {"const": event.name},
                        "data": data_ref,
                    },
                },
            ]
        },
        "x-eventbridge": {"source": event.source, "detail-type": event.name},
    }


def document(template: ExpandedTemplate) -> dict[str, Any]:
    builder = SchemaBuilder()
    messages = {event.name: _message(event, builder.schema(event.data)) for event in EVENT_TYPES}
    address, parameters = _channel_address(template)
    channel_messages = {name: {"$ref": f"#/components/messages/{name}"} for name in messages}
    operations: dict[str, Any] = {}
    for publisher in template.publishers():
        operations[f"{publisher}Publishes"] = {
            "action": "send",
            "title": f"{publisher} publishes the outbox",
            "description": f"`{publisher}` puts each outbox item of the tables' streams on "
            f"`{template.event_bus}` (PutEvents: Source = source, DetailType = type, Detail = the envelope), "
            "in stream order.",
            "channel": {"$ref": f"#/channels/{CHANNEL}"},
            "messages": [{"$ref": f"#/channels/{CHANNEL}/messages/{name}"} for name in messages],
        }
    for rule, receives in received_by(template).items():
        into = ", ".join(f"`{q}`" for q in receives["queues"])
        by = ", ".join(f"`{c}`" for c in receives["consumers"])
        operations[rule] = {
            "action": "receive",
            "title": f"{rule} delivers to {', '.join(receives['consumers']) or 'its targets'}",
            "description": f"{receives['description']} The rule `{rule}` puts the matching events in {into}, "
            f"which {by} consumes.",
            "channel": {"$ref": f"#/channels/{CHANNEL}"},
            "messages": [{"$ref": f"#/channels/{CHANNEL}/messages/{name}"} for name in receives["types"]],
            "x-eventbridge-rule": {"name": rule, "eventPattern": receives["pattern"]},
        }
    channel: dict[str, Any] = {
        "address": address,
        "title": "The event bus",
        "description": f"The custom EventBridge bus `{template.event_bus}` of template.yaml. Every event "
        "is a CloudEvents 1.0 envelope in the Detail of an EventBridge event.",
        "messages": channel_messages,
    }
    if parameters:
        channel["parameters"] = parameters
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "Order saga events",
            "version": DOCUMENT_VERSION,
            "description": "The events of the transactional outbox reference (docs/events.md). Generated "
            "by `python -m tools.docs` from template.yaml, shop/domain/envelope.py and "
            "shop/domain/event_types.py: do not edit.",
        },
        "defaultContentType": CONTENT_TYPE,
        "channels": {CHANNEL: channel},
        "operations": operations,
        "components": {
            "messages": messages,
            "schemas": {ENVELOPE: envelope_schema(), **builder.definitions},
        },
    }


def render(doc: dict[str, Any]) -> str:
    header = "# Generated by `python -m tools.docs` (make docs): do not edit; docs/events.md explains it.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110)


def events_table(template: ExpandedTemplate) -> str:
    receivers: dict[str, list[str]] = {e.name: [] for e in EVENT_TYPES}
    for rule, receives in received_by(template).items():
        for name in receives["types"]:
            receivers[name].append(f"`{rule}` → {ticked(receives['consumers'])}")
    archives = [
        name
        for name, archive in template.of_type("AWS::Events::Archive").items()
        if reference(archive.get("Properties", {}).get("SourceArn")) == template.event_bus
        and "EventPattern" not in archive.get("Properties", {})
    ]
    unreceived = f"no rule ({ticked(archives)} keeps it)" if archives else "no rule"
    rows = [
        [
            f"`{event.name}`",
            f"`{event.source}`",
            cell(event.summary),
            "; ".join(receivers[event.name]) or unreceived,
            f"[`{event.data.__name__}`](asyncapi.yaml)",
        ]
        for event in EVENT_TYPES
    ]
    return table(["Type", "`source`", "Emitted when", "Received by (rule → consumer)", "`data`"], rows)
