"""EventBridge Scheduler schedules (SAM ScheduleV2 events) invoking a function, as AWS documents it.

AWS:
- Lambda developer guide, "Using Lambda with Amazon EventBridge Scheduler"
  (https://docs.aws.amazon.com/lambda/latest/dg/with-eventbridge-scheduler.html): "EventBridge Scheduler
  invokes your Lambda function asynchronously": the schedule does not wait for the function, so a run
  longer than the period overlaps the next one (the outbox publisher relies on it: its 70 s timeout
  overlaps the next minute's start instead of leaving a gap).
- Scheduler user guide, "Schedule types" (https://docs.aws.amazon.com/scheduler/latest/UserGuide/schedule-types.html):
  a rate expression is `rate(value unit)`, a positive integer and minute(s), hour(s) or day(s); targets
  are invoked with 60-second precision.
- The schedule's Input is the payload the function receives; a DISABLED schedule invokes nothing
  (AWS::Scheduler::Schedule, State).

The stack (here): SlowFunction, scheduled rate(1 minute) with an Input, runs 2.5 periods each time;
IdleFunction's schedule is DISABLED. The stack runs a minute in 2 s (schedule_time_scale).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.stacks import running_stack
from tools.local.pollers.event_sources import read_event_sources
from tools.local.pollers.scheduler import ScheduleExpressionError, rate_seconds
from tools.local.services.emulators import LocalServices
from tools.local.stack import LocalStack
from tools.template import Template

SCALE = 2.0 / 60  # a minute lasts 2 s
RUN_SECONDS = 5.0  # 2.5 periods

RECORDING_HANDLER = f"""
import json
import time
import uuid
from pathlib import Path


def handler(event, context):
    run = Path(event["runs"]) / uuid.uuid4().hex
    # Written to a temporary name, then renamed: the test never reads a half-written file.
    run.with_suffix(".tmp").write_text(json.dumps({{"event": event, "start": time.time()}}))
    run.with_suffix(".tmp").rename(run)
    time.sleep({RUN_SECONDS})
    run.with_suffix(".done").write_text(str(time.time()))
    return {{"ok": True}}
"""


def _scheduled(code_dir: Path, runs: Path, state: str) -> dict[str, Any]:
    return {
        "Type": "AWS::Serverless::Function",
        "Properties": {
            "CodeUri": str(code_dir),
            "Handler": "recording.handler",
            "Runtime": "python3.13",
            "Timeout": 10,
            "Events": {
                "EveryMinute": {
                    "Type": "ScheduleV2",
                    "Properties": {
                        "ScheduleExpression": "rate(1 minute)",
                        "State": state,
                        "Input": json.dumps({"runs": str(runs), "from": "schedule"}),
                    },
                }
            },
        },
    }


@pytest.fixture(scope="module")
def runs_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: tmp_path_factory.mktemp(f"runs-{name}") for name in ("slow", "idle")}


@pytest.fixture(scope="module")
def scheduler_stack(
    local_services: LocalServices, tmp_path_factory: pytest.TempPathFactory, runs_dirs: dict[str, Path]
) -> Iterator[LocalStack]:
    def resources(code_dir: Path) -> dict[str, Any]:
        return {
            "SlowFunction": _scheduled(code_dir, runs_dirs["slow"], "ENABLED"),
            "IdleFunction": _scheduled(code_dir, runs_dirs["idle"], "DISABLED"),
        }

    with running_stack(
        "scheduler",
        resources,
        {"recording": RECORDING_HANDLER},
        local_services,
        tmp_path_factory,
        schedule_time_scale=SCALE,
    ) as stack:
        yield stack


def _runs(directory: Path) -> list[dict[str, Any]]:
    """Each started run (a file named by its uuid, written whole by a rename), by start time."""
    started = (p for p in directory.iterdir() if not p.suffix)
    return sorted((json.loads(p.read_text()) for p in started), key=lambda run: run["start"])


def test_a_schedule_invokes_asynchronously_so_a_long_run_overlaps_the_next(
    scheduler_stack: LocalStack, runs_dirs: dict[str, Path]
) -> None:
    scheduler_stack.wait_for(lambda: len(_runs(runs_dirs["slow"])) >= 3, 12, "three scheduled starts")
    runs = _runs(runs_dirs["slow"])
    # The second start came one period after the first, while the first run (2.5 periods) went on.
    # (Later starts may wait for a new execution environment's cold start: only the first gap is timed.)
    assert 1.5 <= runs[1]["start"] - runs[0]["start"] <= 3.0, runs
    assert runs[1]["start"] < runs[0]["start"] + RUN_SECONDS - 1  # the first one was still running
    # The function got the schedule's Input as its event.
    assert runs[0]["event"] == {"runs": str(runs_dirs["slow"]), "from": "schedule"}


def test_a_disabled_schedule_invokes_nothing(scheduler_stack: LocalStack, runs_dirs: dict[str, Path]) -> None:
    scheduler_stack.wait_for(lambda: len(_runs(runs_dirs["slow"])) >= 2, 10, "the enabled schedule ran")
    assert _runs(runs_dirs["idle"]) == []


@pytest.mark.parametrize(
    ("expression", "seconds"),
    [("rate(1 minute)", 60), ("rate(5 minutes)", 300), ("rate(1 hour)", 3600), ("rate(2 days)", 172800)],
)
def test_rate_expressions_as_documented(expression: str, seconds: float) -> None:
    assert rate_seconds(expression) == seconds


@pytest.mark.parametrize(
    "expression", ["rate(1 minutes)", "rate(5 minute)", "rate(0 minutes)", "rate(1.5 hours)"]
)
def test_malformed_rate_expressions_are_refused(expression: str) -> None:
    with pytest.raises(ScheduleExpressionError):
        rate_seconds(expression)


def test_cron_and_at_schedules_are_listed_as_not_emulated() -> None:
    events = {
        name: {"Type": "ScheduleV2", "Properties": {"ScheduleExpression": expression}}
        for name, expression in (("Nightly", "cron(0 3 * * ? *)"), ("Once", "at(2030-01-01T00:00:00)"))
    }
    function = {
        "Type": "AWS::Serverless::Function",
        "Properties": {"CodeUri": ".", "Handler": "a.b", "Runtime": "python3.13", "Events": events},
    }
    sources = read_event_sources(Template({"Resources": {"CronFunction": function}}))
    assert sources.schedules == []
    assert sorted(entry.split(" ")[0] for entry in sources.not_emulated) == [
        "CronFunction.Nightly",
        "CronFunction.Once",
    ]


def test_the_template_schedules_the_outbox_publisher_every_minute_with_an_overlapping_timeout() -> None:
    # What the conformance above makes safe to rely on: the publisher's run outlasts its period.
    template = Template.load(parameters={"OrderStore": "postgres"})
    sources = read_event_sources(template)
    (publisher,) = [s for s in sources.schedules if s.function == "OutboxPublisherFunction"]
    assert publisher.period_seconds == 60
    assert template.function("OutboxPublisherFunction").timeout > publisher.period_seconds
