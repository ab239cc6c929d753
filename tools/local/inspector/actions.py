"""The inspector's redrive buttons: the operator commands themselves, `python -m operations redrive`,
`python -m operations redrive-poison` and, for each consumer's dead-letter queue, `python -m operations
redrive-dlq` (operations/admin.py), run against the local stack.

They run as the command-line tool runs, in a process of their own: the operations code reads its
endpoints and settings from the process environment and keeps its AWS clients for the life of the
process (shop.adapters.aws), so running it inside the stack's process would point the stack's own
clients (and a test session's) elsewhere. The queues and the bus are the ones the CLI reads from the
stack's outputs with --stack-name (RelayDeadLetterQueueUrl, RelayPoisonQueueUrl, EventBusName), given
explicitly; the outbox settings are the relay's, from the template. A consumer dead-letter queue's
redrive moves its messages back to the queue whose RedrivePolicy names it, as the SQS console's "Start
DLQ redrive" does (operations/dead_letters.py): both queues are given. What the command prints (a
report per message and a closing {"redriven", "kept"} line, with "parked" for the relay's) is what the
page shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tools.local.services.emulators import FAKE_CREDENTIALS
from tools.template import REGION, ROOT, Template

if TYPE_CHECKING:
    from tools.local.pollers.event_sources import EventSources
    from tools.local.services.emulators import Endpoints

# Each button: the command, the stack output naming the queue it drains, and its queue option.
RECOVERY_COMMANDS = {
    "redrive": ("RelayDeadLetterQueueUrl", "--queue-url"),
    "redrive-poison": ("RelayPoisonQueueUrl", None),  # the command reads --poison-queue-url
}
# A consumer dead-letter queue's button: its action is "redrive-dlq/<dead-letter queue's logical id>".
DEAD_LETTER_COMMAND = "redrive-dlq"
POISON_QUEUE_OUTPUT = "RelayPoisonQueueUrl"
BUS_OUTPUT = "EventBusName"
# The relay's settings the commands share (shop.runtime.config): the republish window and event size.
_RELAY_SETTINGS = ("OUTBOX_TTL_DAYS", "MAX_EVENT_BYTES", "OUTBOX_TIME_SHARDS")
_TIMEOUT_SECONDS = 120.0
_MAX_MESSAGES = "1000"  # the command's own default


class CommandTarget(Protocol):
    """The stack a command runs against, as the commands read it (a LocalStack; a fake in unit tests):
    its template, queue URLs, endpoints and event sources. The stack hands itself over; the inspector
    never imports it (tests/unit/test_architecture.py: no import circle in tools/)."""

    @property
    def template(self) -> Template: ...
    @property
    def sources(self) -> EventSources: ...
    @property
    def endpoints(self) -> Endpoints: ...
    def queue_url(self, queue: str) -> str: ...


def output_resource(template: Template, output: str) -> str:
    """The logical id of the resource a stack output refers to (`Value: !Ref X`)."""
    value = template.data.get("Outputs", {}).get(output, {}).get("Value")
    if not isinstance(value, dict) or not isinstance(value.get("Ref"), str):
        raise KeyError(f"template.yaml has no output {output} referring to a resource")
    return str(value["Ref"])


def dead_letter_action(dead_letter_queue: str) -> str:
    return f"{DEAD_LETTER_COMMAND}/{dead_letter_queue}"


def dead_letter_sources(template: Template) -> dict[str, str]:
    """Each dead-letter queue of the template (logical id) and the queue whose RedrivePolicy names it."""
    sources = {}
    for queue in template.of_type("AWS::SQS::Queue"):
        if not template.is_created(queue):
            continue
        policy = template.properties(queue).get("RedrivePolicy") or {}
        target = template.logical_id_for_arn(str(policy.get("deadLetterTargetArn", "")))
        if target is not None:
            sources[target] = queue
    return sources


def recovery_queues(template: Template) -> dict[str, str]:
    """The queue (logical id) each action drains: the relay commands this template has the outputs of
    (a test template may have none: its stack then has no relay buttons), and each dead-letter queue's
    redrive to its source queue."""
    actions = {dead_letter_action(dlq): dlq for dlq in dead_letter_sources(template)}
    outputs = template.data.get("Outputs", {})
    if BUS_OUTPUT not in outputs or POISON_QUEUE_OUTPUT not in outputs:
        return actions
    relay = {
        action: output_resource(template, output)
        for action, (output, _) in RECOVERY_COMMANDS.items()
        if output in outputs
    }
    return {**relay, **actions}


def outcome_message(action: str, queue: str, summary: dict[str, Any], complete: bool) -> str:
    """What a finished run did, in a sentence for the page."""
    redriven, kept = int(summary["redriven"]), int(summary["kept"])
    parked = [str(event_id) for event_id in summary.get("parked", [])]
    if action.startswith(f"{DEAD_LETTER_COMMAND}/"):
        message = f"{DEAD_LETTER_COMMAND}: {redriven} message(s) moved from {queue} back to its queue"
        if kept:
            message += f", {kept} kept there (why is listed below)"
        return message + ("." if complete else "; not every message was moved.")
    message = f"{action}: {redriven} message(s) redriven from {queue}"
    if kept:
        message += f", {kept} kept there (what is missing is listed below)"
    if parked:
        message += f"; {len(parked)} event(s) parked in the relay poison queue on the way: " + ", ".join(
            parked
        )
    return message + ("; every event is on the bus." if complete else "; not everything is on the bus.")


@dataclass(frozen=True)
class CommandRun:
    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    def documents(self) -> list[dict[str, Any]]:
        """The JSON lines it printed, less Powertools' log lines (those carry a "level")."""
        found = []
        for line in self.stdout.splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and "level" not in value:
                found.append(value)
        return found

    def summary(self) -> dict[str, Any] | None:
        """The closing line: how many messages were redriven, kept, and the events parked on the way."""
        return next((d for d in self.documents() if "redriven" in d and "kept" in d), None)

    def report(self) -> dict[str, Any]:
        documents = self.documents()
        return {
            "command": " ".join(["python", *self.argv[1:]]),
            "exitCode": self.exit_code,
            "seconds": round(self.seconds, 2),
            "summary": self.summary(),
            "messages": [d for d in documents if "complete" in d],  # a recovery report per message
            "errors": [d for d in documents if "error" in d and "complete" not in d],
            "stderr": self.stderr.strip()[-4000:],
        }


def recovery_argv(stack: CommandTarget, action: str) -> list[str]:
    if action.startswith(f"{DEAD_LETTER_COMMAND}/"):
        return dead_letter_argv(stack, action.removeprefix(f"{DEAD_LETTER_COMMAND}/"))
    output, queue_option = RECOVERY_COMMANDS[action]
    template = stack.template
    argv = [
        sys.executable,
        "-m",
        "operations",
        "--bus",
        template.physical_name(output_resource(template, BUS_OUTPUT)),
        "--poison-queue-url",
        stack.queue_url(output_resource(template, POISON_QUEUE_OUTPUT)),
        action,
        "--max-messages",
        _MAX_MESSAGES,
    ]
    if queue_option is not None:
        argv += [queue_option, stack.queue_url(output_resource(template, output))]
    return argv


def dead_letter_argv(stack: CommandTarget, dead_letter_queue: str) -> list[str]:
    source = dead_letter_sources(stack.template)[dead_letter_queue]
    return [
        sys.executable,
        "-m",
        "operations",
        DEAD_LETTER_COMMAND,
        "--max-messages",
        _MAX_MESSAGES,
        "--queue-url",
        stack.queue_url(dead_letter_queue),
        "--to-queue-url",
        stack.queue_url(source),
    ]


def command_environment(stack: CommandTarget) -> dict[str, str]:
    """The operator's environment pointed at the local stack: its endpoints, fake credentials, no ~/.aws
    files (they must not send the command to a real account), and the relay's outbox settings."""
    relay_environment: dict[str, str] = {}
    for stream in stack.sources.streams:
        relay_environment = stack.template.function(stream.function).environment
        break
    return {
        **os.environ,
        **FAKE_CREDENTIALS,
        **stack.endpoints.environment(),
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "POWERTOOLS_TRACE_DISABLED": "true",
        **{name: relay_environment[name] for name in _RELAY_SETTINGS if name in relay_environment},
    }


def run_recovery(stack: CommandTarget, action: str) -> CommandRun:
    """Run `python -m operations <action>` against the stack and return what it printed."""
    argv = recovery_argv(stack, action)
    began = time.monotonic()
    try:
        completed = subprocess.run(
            argv,
            cwd=ROOT,
            env=command_environment(stack),
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        message = f"the command did not finish within {_TIMEOUT_SECONDS:g} s"
        return CommandRun(argv, -1, stdout, message, time.monotonic() - began)
    seconds = time.monotonic() - began
    return CommandRun(argv, completed.returncode, completed.stdout, completed.stderr, seconds)
