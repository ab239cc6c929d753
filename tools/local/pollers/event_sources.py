"""Event sources of the template's functions, read into typed settings with Lambda's defaults.

SAM function Events of type DynamoDB, SQS, Api and ScheduleV2/Schedule (rate expressions) are emulated,
as are AWS::Lambda::EventSourceMapping resources over the template's own streams and queues. Everything
else is listed as not emulated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tools.local.pollers.patterns import PatternError, parse_pattern
from tools.local.pollers.scheduler import ScheduleExpressionError, ScheduleSource, rate_seconds
from tools.template import Template, TemplateError

IMPLICIT_API = "ServerlessRestApi"


@dataclass(frozen=True, kw_only=True)
class _MappingSource:
    """What a stream's and a queue's event source mapping both have: the function, the mapping's name
    (label: "Function.Name") and Lambda's batching, filtering and partial batch response settings."""

    function: str
    name: str
    batching_window_seconds: float = 0.0
    filters: tuple[dict[str, Any], ...] = ()
    report_batch_item_failures: bool = False
    enabled: bool = True

    @property
    def label(self) -> str:
        return f"{self.function}.{self.name}"


@dataclass(frozen=True, kw_only=True)
class StreamSource(_MappingSource):
    table: str
    starting_position: str = "TRIM_HORIZON"
    batch_size: int = 100
    maximum_retry_attempts: int = -1  # -1: until the record expires
    bisect_on_error: bool = False
    maximum_record_age_seconds: int = -1
    on_failure_arn: str | None = None
    # Batches of one shard processed at once, each item's records still in order (see stream_poller).
    parallelization_factor: int = 1


@dataclass(frozen=True, kw_only=True)
class QueueSource(_MappingSource):
    queue: str
    batch_size: int = 10
    maximum_concurrency: int | None = None  # ScalingConfig.MaximumConcurrency


@dataclass(frozen=True)
class ApiRoute:
    function: str
    name: str
    api: str
    path: str
    method: str  # upper case, or ANY


@dataclass
class EventSources:
    streams: list[StreamSource] = field(default_factory=list)
    queues: list[QueueSource] = field(default_factory=list)
    routes: list[ApiRoute] = field(default_factory=list)
    schedules: list[ScheduleSource] = field(default_factory=list)
    not_emulated: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _flag(value: Any) -> bool:
    return str(value).lower() == "true"


def _filters(properties: dict[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    filters = (properties.get("FilterCriteria") or {}).get("Filters") or []
    patterns = []
    for entry in filters:
        raw = entry.get("Pattern", "")
        try:
            patterns.append(parse_pattern(raw if isinstance(raw, str) else json.dumps(raw)))
        except PatternError as exc:
            raise TemplateError(f"{where}: invalid FilterCriteria pattern: {exc}") from exc
    return tuple(patterns)


def _ref_target(raw: Any) -> str | None:
    if isinstance(raw, dict) and isinstance(raw.get("Ref"), str):
        return str(raw["Ref"])
    if isinstance(raw, dict) and isinstance(raw.get("Fn::GetAtt"), list):
        return str(raw["Fn::GetAtt"][0])
    return None


_STREAM, _QUEUE = "AWS::DynamoDB::Table", "AWS::SQS::Queue"
_SOURCE_WORDS = {_STREAM: ("stream", "table"), _QUEUE: ("queue", "queue")}


def _mapping_source(
    template: Template,
    function: str,
    name: str,
    props: dict[str, Any],
    arn: str,
    found: EventSources,
    resource_type: str,
) -> None:
    """A stream's or a queue's event source mapping (the ARN names a table's stream or a queue, as
    resource_type says): emulated where it is the template's own resource of that type."""
    where = f"{function}.{name}"
    logical_id = template.logical_id_for_arn(str(arn))
    if logical_id is None or template.resources[logical_id]["Type"] != resource_type:
        source, noun = _SOURCE_WORDS[resource_type]
        found.not_emulated.append(f"{where}: {source} {arn} is not a {noun} of this template")
        return
    settings = {
        "function": function,
        "name": name,
        "batching_window_seconds": float(props.get("MaximumBatchingWindowInSeconds", 0)),
        "filters": _filters(props, where),
        "report_batch_item_failures": "ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
        "enabled": _flag(props.get("Enabled", True)),
    }
    if resource_type == _STREAM:
        found.streams.append(_stream_source(logical_id, props, where, settings, found))
    else:
        found.queues.append(_queue_source(logical_id, props, settings))


def _stream_source(
    table: str, props: dict[str, Any], where: str, settings: dict[str, Any], found: EventSources
) -> StreamSource:
    for pattern in settings["filters"]:
        foreign = sorted(set(pattern) - {"dynamodb"})
        if foreign:
            found.warnings.append(
                f"{where}: FilterCriteria uses {foreign}; DynamoDB mappings only support filtering on the "
                "'dynamodb' key (applied locally anyway)"
            )
    parallelization_factor = int(props.get("ParallelizationFactor", 1))
    if not 1 <= parallelization_factor <= 10:
        raise TemplateError(f"{where}: ParallelizationFactor must be 1 to 10, got {parallelization_factor}")
    if props.get("TumblingWindowInSeconds"):
        found.warnings.append(f"{where}: TumblingWindowInSeconds is not emulated")
    on_failure = ((props.get("DestinationConfig") or {}).get("OnFailure") or {}).get("Destination")
    return StreamSource(
        table=table,
        starting_position=str(props.get("StartingPosition", "TRIM_HORIZON")),
        batch_size=int(props.get("BatchSize", 100)),
        maximum_retry_attempts=int(props.get("MaximumRetryAttempts", -1)),
        bisect_on_error=_flag(props.get("BisectBatchOnFunctionError", False)),
        maximum_record_age_seconds=int(props.get("MaximumRecordAgeInSeconds", -1)),
        on_failure_arn=str(on_failure) if on_failure else None,
        parallelization_factor=parallelization_factor,
        **settings,
    )


def _queue_source(queue: str, props: dict[str, Any], settings: dict[str, Any]) -> QueueSource:
    scaling = props.get("ScalingConfig") or {}
    return QueueSource(
        queue=queue,
        batch_size=int(props.get("BatchSize", 10)),
        maximum_concurrency=int(scaling["MaximumConcurrency"]) if "MaximumConcurrency" in scaling else None,
        **settings,
    )


def _schedule_source(function: str, name: str, kind: str, props: dict[str, Any], found: EventSources) -> None:
    where = f"{function}.{name}"
    expression = str(props.get("ScheduleExpression", ""))
    try:
        period = rate_seconds(expression)
    except ScheduleExpressionError as exc:
        found.not_emulated.append(f"{where} ({kind} event: {exc})")
        return
    if (props.get("FlexibleTimeWindow") or {}).get("Mode", "OFF") != "OFF":
        found.warnings.append(f"{where}: FlexibleTimeWindow is not emulated (invoked exactly every period)")
    raw_input = props.get("Input")
    # ScheduleV2 says State: ENABLED/DISABLED; Schedule (EventBridge rules) says Enabled or State.
    state = str(props.get("State", "ENABLED" if _flag(props.get("Enabled", True)) else "DISABLED"))
    found.schedules.append(
        ScheduleSource(
            function=function,
            name=name,
            period_seconds=period,
            payload=json.loads(raw_input) if isinstance(raw_input, str) else raw_input,
            enabled=state.upper() == "ENABLED",
        )
    )


def read_event_sources(template: Template) -> EventSources:
    found = EventSources()
    for function in template.of_type("AWS::Serverless::Function"):
        if not template.is_created(function):
            continue
        raw_events = template.resources[function].get("Properties", {}).get("Events", {}) or {}
        for name, event in template.function(function).events.items():
            kind = event.get("Type")
            props = event.get("Properties", {})
            if kind == "DynamoDB":
                _mapping_source(template, function, name, props, props["Stream"], found, _STREAM)
            elif kind == "SQS":
                _mapping_source(template, function, name, props, props["Queue"], found, _QUEUE)
            elif kind == "Api":
                raw_api = raw_events.get(name, {}).get("Properties", {}).get("RestApiId")
                found.routes.append(
                    ApiRoute(
                        function=function,
                        name=name,
                        api=_ref_target(raw_api) or IMPLICIT_API,
                        path=str(props["Path"]),
                        method=str(props["Method"]).upper(),
                    )
                )
            elif kind in ("ScheduleV2", "Schedule"):
                _schedule_source(function, name, kind, props, found)
            else:
                found.not_emulated.append(f"{function}.{name} ({kind} event)")

    for logical_id in template.of_type("AWS::Lambda::EventSourceMapping"):
        if not template.is_created(logical_id):
            continue
        raw = template.resources[logical_id].get("Properties", {})
        props = template.properties(logical_id)
        target = _ref_target(raw.get("FunctionName"))
        source_arn = str(props.get("EventSourceArn", ""))
        if target is None or target not in template.resources:
            found.not_emulated.append(
                f"{logical_id}: function {props.get('FunctionName')} is not in this template"
            )
        elif ":dynamodb:" in source_arn:
            _mapping_source(template, target, logical_id, props, source_arn, found, _STREAM)
        elif ":sqs:" in source_arn:
            _mapping_source(template, target, logical_id, props, source_arn, found, _QUEUE)
        else:
            found.not_emulated.append(f"{logical_id} (event source {source_arn})")
    return found
