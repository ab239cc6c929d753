"""The stack a chaos run runs on: its template (the consumer queues' visibility timeout on the run's time
scale), where things are in it (Topology: the consumer queues and their DLQs, the relay's queues, the
routes duplicates are sent on), and the parts an epilogue gets once the run is checked (Live)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from tools.chaos.bus import BusCapture, DuplicateRoute, Duplicator, NotificationCapture
from tools.chaos.config import POSTGRES, ChaosConfig
from tools.chaos.driver import OrderOutcome
from tools.chaos.evidence import (
    Check,
)
from tools.local.pollers.event_sources import read_event_sources
from tools.local.stack import LocalStack
from tools.template import Template

POISON_QUEUE_VARIABLE = "RELAY_POISON_QUEUE_URL"
_VISIBILITY_MARGIN_SECONDS = 5


def chaos_template(config: ChaosConfig) -> Template:
    data = copy.deepcopy(Template.load().data)
    parameters = {}
    if config.max_receive_count is not None:
        parameters["ConsumerMaxReceiveCount"] = str(config.max_receive_count)
    if config.parallelization_factor is not None:
        parameters["RelayParallelizationFactor"] = str(config.parallelization_factor)
    if config.postgres:
        allowed = data["Parameters"]["PostgresRelay"]["AllowedValues"]
        if config.postgres_relay not in allowed:
            raise ValueError(f"postgres_relay must be one of {allowed}, not {config.postgres_relay!r}")
        parameters["OrderStore"] = POSTGRES
        parameters["PostgresRelay"] = config.postgres_relay
        parameters["MaxEventBytes"] = str(config.max_event_bytes)
    template = Template(data, parameters=parameters, stack_name=config.stack_name)
    for source in read_event_sources(template).queues:
        timeout = template.function(source.function).timeout
        # The template's own data (it keeps an expanded copy of what it was given), read anew by its views.
        template.data["Resources"][source.queue]["Properties"]["VisibilityTimeout"] = (
            timeout + _VISIBILITY_MARGIN_SECONDS
        )
    return template


@dataclass
class Topology:
    """Where things are, read from the template: consumer queues and their DLQs, the relay's queues."""

    consumer_queues: dict[str, str] = field(default_factory=dict)  # queue -> function
    consumer_dlqs: dict[str, str] = field(default_factory=dict)  # queue -> its dead-letter queue
    relay_dlq: str = ""  # the mappings' OnFailure: batches that aged out (must stay empty here)
    relay_poison_queue: str = ""  # where the relay parks poison records whole
    routes: list[DuplicateRoute] = field(default_factory=list)

    @classmethod
    def of(cls, stack: LocalStack) -> Topology:
        template = stack.template
        topology = cls()
        for source in stack.sources.queues:
            topology.consumer_queues[source.queue] = source.function
            redrive = template.properties(source.queue).get("RedrivePolicy") or {}
            dlq = template.logical_id_for_arn(str(redrive.get("deadLetterTargetArn", "")))
            if dlq is not None:
                topology.consumer_dlqs[source.queue] = dlq
        relay_dlqs = {s.on_failure_arn for s in stack.sources.streams if s.on_failure_arn}
        if len(relay_dlqs) != 1:
            raise RuntimeError(f"expected one OnFailure destination for the relay, found {relay_dlqs}")
        topology.relay_dlq = template.logical_id_for_arn(relay_dlqs.pop()) or ""
        topology.relay_poison_queue = relay_poison_queue(template)
        for rule in template.of_type("AWS::Events::Rule"):
            for target in template.properties(rule).get("Targets", []):
                queue = template.logical_id_for_arn(str(target.get("Arn", "")))
                if queue in topology.consumer_queues:
                    topology.routes.append(DuplicateRoute(rule, queue, topology.consumer_queues[queue]))
        return topology


def relay_poison_queue(template: Template) -> str:
    """The queue the relay parks poison in: the one its RELAY_POISON_QUEUE_URL refers to."""
    relays = {s.function for s in read_event_sources(template).streams}
    urls = {str(template.function(f).environment.get(POISON_QUEUE_VARIABLE, "")) for f in relays}
    found = [
        queue for queue in template.of_type("AWS::SQS::Queue") if template.resolve({"Ref": queue}) in urls
    ]
    if len(found) != 1:
        raise RuntimeError(f"expected one poison queue ({POISON_QUEUE_VARIABLE}) of the relay, found {found}")
    return found[0]


@dataclass
class Live:
    """What an epilogue gets: the running stack's parts, after the run was drained and checked."""

    topology: Topology
    capture: BusCapture
    notifications: NotificationCapture
    duplicator: Duplicator
    outcomes: list[OrderOutcome]
    checks: list[Check]
