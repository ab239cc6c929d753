"""The inspector's redrive buttons: the operator commands themselves, `python -m operations redrive`,
`python -m operations redrive-poison` and, for each consumer's dead-letter queue, `python -m operations
redrive-dlq` (operations/admin.py), run against the local stack.

They run as the command-line tool runs, in a process of their own, with the operator's environment
pointed at the local stack (tools/local/operator_commands.py). The queues and the bus are the ones the
CLI reads from the stack's outputs with --stack-name (RelayDeadLetterQueueUrl, RelayPoisonQueueUrl,
EventBusName), given explicitly; the outbox settings are the relay's, from the template. A consumer
dead-letter queue's redrive moves its messages back to the queue whose RedrivePolicy names it, as the
SQS console's "Start DLQ redrive" does (operations/dead_letters.py): both queues are given. What the
command prints (a report per message and a closing {"redriven", "kept"} line, with "parked" for the
relay's) is what the page shows.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Protocol

from tools.local.operator_commands import CommandRun, CommandStack, command_environment, run_command
from tools.template import Template

if TYPE_CHECKING:
    pass

# Each button: the command, the stack output naming the queue it drains, and its queue option.
RECOVERY_COMMANDS = {
    "redrive": ("RelayDeadLetterQueueUrl", "--queue-url"),
    "redrive-poison": ("RelayPoisonQueueUrl", None),  # the command reads --poison-queue-url
}
# A consumer dead-letter queue's button: its action is "redrive-dlq/<dead-letter queue's logical id>".
DEAD_LETTER_COMMAND = "redrive-dlq"
POISON_QUEUE_OUTPUT = "RelayPoisonQueueUrl"
BUS_OUTPUT = "EventBusName"
_TIMEOUT_SECONDS = 120.0
_MAX_MESSAGES = "1000"  # the command's own default


class CommandTarget(CommandStack, Protocol):
    """The stack a command runs against, as the commands read it (a LocalStack; a fake in unit tests):
    its template, queue URLs, endpoints and event sources. The stack hands itself over; the inspector
    never imports it (tests/unit/test_architecture.py: no import circle in tools/)."""

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


def run_recovery(stack: CommandTarget, action: str) -> CommandRun:
    """Run `python -m operations <action>` against the stack and return what it printed."""
    return run_command(recovery_argv(stack, action), command_environment(stack), _TIMEOUT_SECONDS)
