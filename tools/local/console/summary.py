"""The start-up summary a person sees after `make local`."""

from __future__ import annotations

import json
import shlex
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.local.console.render import Console, short_name
from tools.local.pollers import queue_poller
from tools.template import ROOT

if TYPE_CHECKING:
    from tools.local.pollers.event_sources import ApiRoute
    from tools.local.sam_env import SamEnvironment
    from tools.local.stack import LocalStack

EVENTS_DIR = ROOT / "events"
IDEMPOTENCY_KEY = "Idempotency-Key"
_BOLD, _DIM, _YELLOW, _RED = "\033[1m", "\033[2m", "\033[33m", "\033[31m"


def _sample_request(route: ApiRoute) -> dict[str, Any] | None:
    """A sample event from events/ for this route, to turn into a curl example (shortest name wins)."""
    sample = _sample_event(route)
    return sample[1] if sample is not None else None


def _sample_event(route: ApiRoute) -> tuple[Path, dict[str, Any]] | None:
    """The file and event of _sample_request."""
    for path in sorted(EVENTS_DIR.glob("*.json"), key=lambda p: (len(p.name), p.name)):
        try:
            event = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if (
            isinstance(event, dict)
            and event.get("resource") == route.path
            and event.get("httpMethod") == route.method
            and event.get("body")
        ):
            return path, event
    return None


def curl_example(base_url: str, routes: list[ApiRoute]) -> str | None:
    """A POST of the first route with a sample event, with its Content-Type and, when the sample carries
    one (docs/api.md asks for it on every POST /orders), an Idempotency-Key: a fresh UUID, so the first
    paste places a new order."""
    for route in routes:
        if route.method != "POST" or "{" in route.path:
            continue
        sample = _sample_request(route)
        if sample is None:
            continue
        headers = {str(k).lower(): v for k, v in (sample.get("headers") or {}).items()}
        parts = ["curl", "-si", "-X", "POST", f"{base_url}{route.path}"]
        if headers.get("content-type"):
            parts += ["-H", f"Content-Type: {headers['content-type']}"]
        if IDEMPOTENCY_KEY.lower() in headers:
            parts += ["-H", f"{IDEMPOTENCY_KEY}: {uuid.uuid4()}"]
        parts += ["-d", str(sample["body"])]
        return shlex.join(parts)
    return None


def sam_invoke_example(sam: SamEnvironment, routes: list[ApiRoute]) -> str | None:
    """`sam local invoke` of the function behind the first route with a sample event (the curl example's)."""
    for route in routes:
        if route.method != "POST" or "{" in route.path:
            continue
        sample = _sample_event(route)
        if sample is not None:
            return sam.invoke_command(route.function, sample[0])
    return None


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def startup_summary(stack: LocalStack, console: Console, sam: SamEnvironment | None = None) -> list[str]:
    def bold(text: str) -> str:
        return console.paint(text, _BOLD)

    def dim(text: str) -> str:
        return console.paint(text, _DIM)

    report = stack.report
    provisioning = report.provisioning
    width = max((len(line.logical_id) for line in provisioning.created + provisioning.emulated), default=10)
    lines = [
        bold(f"Local stack ready in {report.seconds:.1f} s")
        + dim(f"  (stack name {stack.template.stack_name!r})")
    ]
    lines.append(bold("Resources"))
    for line in provisioning.created:
        lines.append(f"  created       {line.logical_id:<{width}}  {dim(line.detail)}")
    for line in provisioning.emulated:
        lines.append(f"  emulated      {line.logical_id:<{width}}  {dim(line.detail)}")
    # Grouped by type and reason: templates have many alarms, roles and log groups.
    groups: dict[tuple[str, str], list[str]] = {}
    for line in provisioning.not_emulated:
        groups.setdefault((line.resource_type, line.detail), []).append(line.logical_id)
    if groups:
        lines.append(console.paint("  not emulated locally:", _YELLOW))
    for (resource_type, reason), logical_ids in groups.items():
        lines.append(console.paint(f"    {resource_type} ({reason}): {', '.join(logical_ids)}", _YELLOW))
    for note in report.functions_not_emulated:
        lines.append(console.paint(f"  not emulated locally: {note}", _YELLOW))
    for logical_id, count in provisioning.seeded.items():
        lines.append(
            f"  seeded        {logical_id:<{width}}  {dim(f'{count} item(s) from tools/local/seed.json')}"
        )

    sources = stack.sources
    if sources.streams or sources.queues or sources.schedules:
        lines.append(bold("Event sources"))
    for stream in sources.streams:
        settings = f"batch {stream.batch_size}, window {stream.batching_window_seconds:g} s, " + (
            f"retries {stream.maximum_retry_attempts}, bisect {'on' if stream.bisect_on_error else 'off'}"
        )
        if stream.filters:
            settings += f", {len(stream.filters)} filter(s)"
        if stream.on_failure_arn:
            settings += f", on failure → {stream.on_failure_arn.rsplit(':', 1)[-1]}"
        if stream.parallelization_factor > 1:
            settings += f", {stream.parallelization_factor} batches per shard at once (in order per item)"
        lines.append(f"  {stream.table} stream → {short_name(stream.function)}  {dim(settings)}")
    for queue in sources.queues:
        settings = f"batch {queue.batch_size}, window {queue.batching_window_seconds:g} s"
        if queue.report_batch_item_failures:
            settings += ", partial batch responses"
        runtime = stack.functions.get(queue.function)
        if runtime is not None:
            settings += f", up to {queue_poller.batches_at_once(queue, runtime)} batches at once"
        lines.append(f"  {queue.queue} → {short_name(queue.function)}  {dim(settings)}")
    for schedule in sources.schedules:
        every = f"every {schedule.period_seconds * stack.options.schedule_time_scale:g} s"
        settings = f"{every}, asynchronous (runs may overlap)" if schedule.enabled else "DISABLED"
        lines.append(f"  schedule {schedule.name} → {short_name(schedule.function)}  {dim(settings)}")
    for note in sources.not_emulated:
        lines.append(console.paint(f"  not emulated locally: {note}", _YELLOW))
    for warning in sources.warnings:
        lines.append(console.paint(f"  note: {warning}", _YELLOW))
    for function, error in report.init_errors.items():
        lines.append(
            console.paint(f"  {function} failed to start: {error.error_type}: {error.message}", _RED)
        )

    endpoints = stack.endpoints
    storage = (
        f"data in {_relative(stack.options.data_dir / 'dynamodb')}"
        if stack.services.persistent
        else "in memory"
    )
    lines.append(bold("Services"))
    lines.append(f"  DynamoDB Local                {endpoints.dynamodb}  {dim(storage)}")
    lines.append(f"  moto (EventBridge, SQS, SNS)  {endpoints.moto}")
    database = stack.template.application_outputs.get("OrderDatabase")
    if database:
        where = f"socket {_relative(Path(database['Endpoint']))}, database {database['DatabaseName']}"
        relay = stack.template.parameter_values["PostgresRelay"]
        lines.append(f"  PostgreSQL (orders)           {where}, outbox relay {relay}")
    lines.append(f"  function logs                 {_relative(stack.options.log_dir)}/<LogicalId>.log")
    reserved = {
        short_name(name): runtime.max_concurrency
        for name, runtime in stack.functions.items()
        if runtime.spec.reserved_concurrency is not None
    }
    concurrency = f"up to {stack.options.max_concurrency} execution environments per function"
    if reserved:
        concurrency += " (reserved: " + ", ".join(f"{n} {c}" for n, c in reserved.items()) + ")"
    lines.append(f"  functions                     {dim(concurrency)}")
    for topic, url in provisioning.capture_queues.items():
        lines.append(f"  published to {topic}: {dim(url)}")

    if stack.api is not None:
        what = dim("orders, each one's timeline, queues, redrive")
        lines.append(bold("Inspector") + f"  {stack.inspector_url}  {what}")
        lines.append(bold("API") + f"  {stack.api_url}")
        for route in sources.routes:
            lines.append(f"  {route.method:<6} {route.path}  {dim('→ ' + short_name(route.function))}")
        invocations = "/2015-03-31/functions/<FunctionName>/invocations"  # tools/local/gateway/lambda_api.py
        lines.append(f"  POST   {invocations}  {dim('→ Lambda Invoke API (python -m operations --local)')}")
        if report.auth_not_enforced:
            note = "authorization is not enforced locally: " + ", ".join(report.auth_not_enforced)
            lines.append(console.paint(f"  {note}", _YELLOW))
        example = curl_example(stack.api_url, sources.routes)
        if example:
            lines.append(bold("Try"))
            lines.append(f"  {example}")
            lines.append(dim("  then GET the Location it returns; each hop shows up below."))
            if IDEMPOTENCY_KEY in example:
                lines.append(
                    dim(f"  (another order needs another {IDEMPOTENCY_KEY}: the same one replays this one)")
                )
        invoke = sam_invoke_example(sam, sources.routes) if sam is not None else None
        if sam is not None and invoke:
            if not example:
                lines.append(bold("Try"))
            files = f"{_relative(sam.env_vars_path)}, {_relative(sam.container_env_path)}"
            how = f"with Docker, after `sam build`: one function in a container, on this stack ({files}):"
            lines.append(dim(f"  {how}"))
            lines.append(f"  {invoke}")
    lines.append(dim("Ctrl-C stops everything."))
    return lines
