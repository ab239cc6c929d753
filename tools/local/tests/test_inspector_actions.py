"""The inspector's redrive buttons without a browser (tools/local/inspector/actions.py): the exact operator
command each runs, `python -m operations ...`, with the stack's queues, bus and the relay's settings;
that the CLI itself reads that command line as meant; how the command is run; and what the page is told
from its output, through the JSON API (tests/integration/test_inspector_browser.py clicks the same
buttons in Chromium, where there is one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from operations import admin
from tools.local.inspector.actions import (
    recovery_argv,
    recovery_queues,
    run_recovery,
)
from tools.local.inspector.api import inspector_for
from tools.local.operator_commands import CommandRun, command_environment
from tools.local.pollers.event_sources import EventSources, read_event_sources
from tools.local.services.emulators import FAKE_CREDENTIALS, Endpoints
from tools.local.tests.command_reports import POISON_REPORT, POWERTOOLS_LINE
from tools.template import REGION, ROOT, Template

MOTO = "http://127.0.0.1:45123"
ENDPOINTS = Endpoints(dynamodb="http://127.0.0.1:45124", moto=MOTO)


def queue_url(queue: str) -> str:
    return f"{MOTO}/123456789012/local-{queue}"


@dataclass
class FakeStack:
    """What the actions read of a LocalStack (actions.CommandTarget): its template, queue URLs, endpoints
    and event sources."""

    template: Template
    sources: EventSources = field(init=False)
    endpoints: Endpoints = ENDPOINTS

    def __post_init__(self) -> None:
        self.sources = read_event_sources(self.template)

    def queue_url(self, queue: str) -> str:
        return queue_url(queue)


@pytest.fixture
def stack(template: Template) -> FakeStack:
    return FakeStack(template)


# The command lines, written out: the stack output each button reads (RelayDeadLetterQueueUrl,
# RelayPoisonQueueUrl, EventBusName) resolved as the CLI would resolve them with --stack-name.
RELAY_COMMAND = [  # both relay buttons: the bus and the poison queue come first
    "-m",
    "operations",
    "--bus",
    "local-EventBus",
    "--poison-queue-url",
    queue_url("RelayPoisonQueue"),
]
REDRIVE = [
    *RELAY_COMMAND,
    "redrive",
    "--max-messages",
    "1000",
    "--queue-url",
    queue_url("RelayDeadLetterQueue"),
]
REDRIVE_POISON = [*RELAY_COMMAND, "redrive-poison", "--max-messages", "1000"]


@pytest.mark.parametrize(("action", "arguments"), [("redrive", REDRIVE), ("redrive-poison", REDRIVE_POISON)])
def test_each_button_runs_the_operator_command_on_the_stacks_queues_and_bus(
    stack: FakeStack, action: str, arguments: list[str]
) -> None:
    assert recovery_argv(stack, action) == [sys.executable, *arguments]


@pytest.mark.parametrize(
    ("action", "arguments", "handler"),
    [("redrive", REDRIVE, "redrive"), ("redrive-poison", REDRIVE_POISON, "redrive_poison")],
)
def test_the_operator_cli_reads_each_command_line_as_the_button_means_it(
    stack: FakeStack, monkeypatch: pytest.MonkeyPatch, action: str, arguments: list[str], handler: str
) -> None:
    """operations.admin's own parser (what `python -m operations` runs), its command replaced by a
    recorder: the global options before the command, the queue the right one, nothing from a stack."""
    seen: list[Any] = []

    def record(args: Any) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(admin, handler, record)

    assert admin.main(recovery_argv(stack, action)[3:]) == 0

    [args] = seen
    assert (args.command, args.bus, args.poison_queue_url, args.stack_name, args.max_messages) == (
        action,
        "local-EventBus",
        queue_url("RelayPoisonQueue"),
        None,
        1000,
    )
    if action == "redrive":
        assert args.queue_url == queue_url("RelayDeadLetterQueue")


def test_the_command_runs_against_the_local_stack_only_with_the_relays_outbox_settings(
    stack: FakeStack, template: Template
) -> None:
    environment = command_environment(stack)

    relay = template.function("OutboxRelayFunction").environment
    assert {name: environment[name] for name in ("OUTBOX_TTL_DAYS", "MAX_EVENT_BYTES")} == {
        "OUTBOX_TTL_DAYS": relay["OUTBOX_TTL_DAYS"],
        "MAX_EVENT_BYTES": relay["MAX_EVENT_BYTES"],
    }
    assert {name: environment[name] for name in FAKE_CREDENTIALS} == FAKE_CREDENTIALS
    for name, url in ENDPOINTS.environment().items():
        assert environment[name] == url
    # No ~/.aws file may send the command to a real account, whatever this machine holds.
    assert (environment["AWS_CONFIG_FILE"], environment["AWS_SHARED_CREDENTIALS_FILE"]) == (os.devnull,) * 2
    assert (environment["AWS_REGION"], environment["AWS_DEFAULT_REGION"]) == (REGION, REGION)
    assert environment["POWERTOOLS_TRACE_DISABLED"] == "true"


KEPT_REPORT = {**POISON_REPORT, "messageId": "m-2", "published": 0, "complete": False, "missing": ["e-9"]}


@dataclass
class Completed:
    """subprocess.run replaced: records each call, answers with the given output."""

    stdout: str
    returncode: int = 0
    stderr: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append({"argv": argv, **kwargs})
        return subprocess.CompletedProcess(argv, self.returncode, self.stdout, self.stderr)


def lines(*documents: dict[str, Any]) -> str:
    return "\n".join(["not json: a warning", *(json.dumps(d) for d in documents)]) + "\n"


def test_the_command_runs_in_the_repository_in_a_process_of_its_own_with_a_time_limit(
    stack: FakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    completed = Completed(lines(POWERTOOLS_LINE, POISON_REPORT, {"redriven": 1, "kept": 0, "parked": []}))
    monkeypatch.setattr(subprocess, "run", completed)

    run = run_recovery(stack, "redrive-poison")

    [call] = completed.calls
    assert call["argv"] == [sys.executable, *REDRIVE_POISON]
    assert call["cwd"] == ROOT  # where `-m operations` is found
    assert call["env"] == command_environment(stack)
    assert call["timeout"] == 120.0
    assert (call["check"], call["capture_output"], call["text"]) == (False, True, True)
    assert (run.exit_code, run.summary()) == (0, {"redriven": 1, "kept": 0, "parked": []})


def test_a_command_past_its_time_limit_is_reported_as_such_with_what_it_printed(
    stack: FakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hangs(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"], output=json.dumps(POISON_REPORT).encode())

    monkeypatch.setattr(subprocess, "run", hangs)

    run = run_recovery(stack, "redrive")

    assert (run.exit_code, run.stderr) == (-1, "the command did not finish within 120 s")
    assert run.report()["messages"] == [POISON_REPORT]
    assert run.summary() is None  # no closing line: the API answers command_failed


JSON_POST = [
    ("Content-Type", "application/json"),
    ("Host", "127.0.0.1:3000"),
    ("Origin", "http://127.0.0.1:3000"),
]


@dataclass
class Buttons:
    """The stack's buttons through the JSON API, with subprocess.run answering what the command prints."""

    stack: FakeStack
    monkeypatch: pytest.MonkeyPatch

    def command_prints(self, *documents: dict[str, Any], returncode: int = 0, stderr: str = "") -> Completed:
        completed = Completed(lines(*documents), returncode, stderr)
        self.monkeypatch.setattr(subprocess, "run", completed)
        return completed

    def post(self, action: str) -> tuple[int, dict[str, Any]]:
        answer = inspector_for(self.stack).handle("POST", f"/_local/api/actions/{action}", JSON_POST, b"{}")  # type: ignore[arg-type]
        return answer.status, json.loads(answer.body)


@pytest.fixture
def buttons(stack: FakeStack, monkeypatch: pytest.MonkeyPatch) -> Buttons:
    return Buttons(stack, monkeypatch)


def test_the_poison_button_through_the_api_answers_the_exact_command_and_its_report(buttons: Buttons) -> None:
    summary = {"redriven": 1, "kept": 0, "parked": []}
    completed = buttons.command_prints(POWERTOOLS_LINE, POISON_REPORT, summary)

    status, document = buttons.post("redrive-poison")

    assert status == 200
    assert [call["argv"] for call in completed.calls] == [[sys.executable, *REDRIVE_POISON]]
    assert document["command"] == " ".join(["python", *REDRIVE_POISON])
    assert (document["action"], document["queue"], document["exitCode"]) == (
        "redrive-poison",
        "RelayPoisonQueue",
        0,
    )
    assert (document["summary"], document["messages"], document["errors"]) == (summary, [POISON_REPORT], [])
    assert document["complete"] is True
    assert document["message"] == (
        "redrive-poison: 1 message(s) redriven from RelayPoisonQueue; every event is on the bus."
    )


def test_the_dead_letter_button_reports_what_it_kept_and_what_it_parked_on_the_way(buttons: Buttons) -> None:
    summary = {"redriven": 1, "kept": 1, "parked": ["e-7"]}
    buttons.command_prints(
        POISON_REPORT, KEPT_REPORT, {"error": "PutEvents throttled"}, summary, returncode=1
    )

    status, document = buttons.post("redrive")

    assert status == 200
    assert document["command"] == " ".join(["python", *REDRIVE])
    assert (document["queue"], document["exitCode"]) == ("RelayDeadLetterQueue", 1)
    assert document["complete"] is False
    assert document["messages"] == [POISON_REPORT, KEPT_REPORT]
    assert document["errors"] == [{"error": "PutEvents throttled"}]
    assert document["message"] == (
        "redrive: 1 message(s) redriven from RelayDeadLetterQueue, 1 kept there (what is missing is listed"
        " below); 1 event(s) parked in the relay poison queue on the way: e-7; not everything is on the bus."
    )


def test_a_command_that_dies_without_its_closing_report_is_a_500_naming_the_command_line(
    buttons: Buttons,
) -> None:
    buttons.command_prints(
        returncode=2, stderr="usage: python -m operations ...\nerror: unrecognized arguments"
    )

    status, document = buttons.post("redrive")

    assert status == 500
    assert document["error"]["code"] == "command_failed"
    assert document["error"]["message"].startswith(" ".join(["python", *REDRIVE]) + " exited 2 ")
    assert "unrecognized arguments" in document["error"]["message"]
    assert document["report"]["stderr"].startswith("usage: python -m operations")


def test_a_run_that_found_nothing_is_a_409_naming_the_queue(buttons: Buttons) -> None:
    buttons.command_prints({"redriven": 0, "kept": 0, "parked": []})

    status, document = buttons.post("redrive-poison")

    assert (status, document["error"]["code"]) == (409, "nothing_to_redrive")
    assert document["error"]["message"] == (
        "nothing to redrive: RelayPoisonQueue holds no message (redrive-poison found none)"
    )
    assert document["report"]["command"] == " ".join(["python", *REDRIVE_POISON])


def test_command_run_keeps_the_commands_json_documents_not_its_log_lines() -> None:
    run = CommandRun(
        ["/venv/bin/python", "-m", "operations", "redrive"],
        0,
        lines(POWERTOOLS_LINE, POISON_REPORT, {"error": "x"}, {"redriven": 1, "kept": 0}),
        "",
        1.234,
    )

    assert run.documents() == [POISON_REPORT, {"error": "x"}, {"redriven": 1, "kept": 0}]
    assert run.report()["seconds"] == 1.23
    assert run.report()["command"] == "python -m operations redrive"


# --- a consumer dead-letter queue's button: python -m operations redrive-dlq -----------------------------
def redrive_dlq(dead_letter_queue: str, queue: str) -> list[str]:
    """The command line of a consumer dead-letter queue's button: its messages back to the queue whose
    RedrivePolicy names it, both given."""
    return [
        "-m",
        "operations",
        "redrive-dlq",
        "--max-messages",
        "1000",
        "--queue-url",
        queue_url(dead_letter_queue),
        "--to-queue-url",
        queue_url(queue),
    ]


CONSUMER_QUEUES = [
    ("InventoryDeadLetterQueue", "InventoryQueue"),
    ("OrderStatusDeadLetterQueue", "OrderStatusQueue"),
    ("NotificationDeadLetterQueue", "NotificationQueue"),
]


def test_every_consumer_dead_letter_queue_has_a_redrive_and_the_relay_queues_theirs(
    template: Template,
) -> None:
    assert recovery_queues(template) == {
        "redrive": "RelayDeadLetterQueue",
        "redrive-poison": "RelayPoisonQueue",
        **{f"redrive-dlq/{dead_letters}": dead_letters for dead_letters, _ in CONSUMER_QUEUES},
    }


@pytest.mark.parametrize(("dead_letter_queue", "queue"), CONSUMER_QUEUES)
def test_a_dead_letter_queues_button_moves_its_messages_back_to_its_queue(
    stack: FakeStack, dead_letter_queue: str, queue: str
) -> None:
    argv = recovery_argv(stack, f"redrive-dlq/{dead_letter_queue}")

    assert argv == [sys.executable, *redrive_dlq(dead_letter_queue, queue)]


def test_the_operator_cli_reads_the_dead_letter_command_line_as_the_button_means_it(
    stack: FakeStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []

    def record(args: Any) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(admin, "redrive_dead_letters", record)

    assert admin.main(recovery_argv(stack, "redrive-dlq/OrderStatusDeadLetterQueue")[3:]) == 0

    [args] = seen
    assert (args.command, args.queue_url, args.to_queue_url, args.max_messages, args.stack_name) == (
        "redrive-dlq",
        queue_url("OrderStatusDeadLetterQueue"),
        queue_url("OrderStatusQueue"),
        1000,
        None,
    )


MOVED_REPORT = {
    "messageId": "m-1",
    "destination": queue_url("InventoryQueue"),
    "newMessageId": "m-9",
    "complete": True,
}


def test_the_dead_letter_button_through_the_api_answers_the_exact_command_and_what_it_moved(
    buttons: Buttons,
) -> None:
    completed = buttons.command_prints(MOVED_REPORT, {"redriven": 1, "kept": 0})

    status, document = buttons.post("redrive-dlq/InventoryDeadLetterQueue")

    assert status == 200
    arguments = redrive_dlq("InventoryDeadLetterQueue", "InventoryQueue")
    assert [call["argv"] for call in completed.calls] == [[sys.executable, *arguments]]
    assert document["command"] == " ".join(["python", *arguments])
    assert (document["action"], document["queue"], document["complete"]) == (
        "redrive-dlq/InventoryDeadLetterQueue",
        "InventoryDeadLetterQueue",
        True,
    )
    assert document["messages"] == [MOVED_REPORT]
    assert (
        document["message"]
        == "redrive-dlq: 1 message(s) moved from InventoryDeadLetterQueue back to its queue."
    )


def test_a_dead_letter_redrive_that_kept_a_message_says_so(buttons: Buttons) -> None:
    kept = {**MOVED_REPORT, "complete": False, "error": "not moved: SendMessage failed: AccessDenied"}
    buttons.command_prints(kept, {"redriven": 0, "kept": 1}, returncode=1)

    status, document = buttons.post("redrive-dlq/InventoryDeadLetterQueue")

    assert (status, document["complete"]) == (200, False)
    assert document["messages"] == [kept]
    assert document["message"] == (
        "redrive-dlq: 0 message(s) moved from InventoryDeadLetterQueue back to its queue, 1 kept there"
        " (why is listed below); not every message was moved."
    )


def test_a_queue_that_is_no_dead_letter_queue_has_no_redrive(buttons: Buttons) -> None:
    completed = buttons.command_prints({"redriven": 1, "kept": 0})

    status, document = buttons.post("redrive-dlq/InventoryQueue")

    assert (status, document["error"]["code"]) == (404, "not_found")
    assert completed.calls == []
