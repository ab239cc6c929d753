"""Creates the template's resources in DynamoDB Local and moto, generically by resource type.

Every resource is accounted for: created, emulated by another part of the stack, or reported as not
emulated with the reason. Names are Template.physical_name(logical_id), so the functions' resolved
environment, the tests and the stack agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from tools.local.services.emulators import FAKE_CREDENTIALS, AwsClients
from tools.template import REGION, ROOT, Template, TemplateError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_sns import SNSClient
    from mypy_boto3_sqs import SQSClient

SEED_FILE = Path(__file__).resolve().parents[1] / "seed.json"  # tools/local/seed.json
# Seed sections in the project's domain format are applied by the project's own seed command, so the
# key design stays in one place (shop.adapters.dynamodb.keys). Placeholders: {file} and any template
# output name.
DOMAIN_SEED_COMMANDS = {
    "stock": ("-m", "operations", "seed", "--table", "{InventoryTableName}", "--file", "{file}"),
}
_SEED_COMMAND_TIMEOUT_SECONDS = 60
_TABLE_ACTIVE_TIMEOUT_SECONDS = 10.0
_BATCH_WRITE_LIMIT = 25
_BATCH_WRITE_ATTEMPTS = 5

# Resource types another part of the local stack stands in for.
EMULATED_TYPES = {
    "AWS::Serverless::Function": "local worker processes (execution environments on demand)",
    "AWS::Serverless::LayerVersion": "its folder on the functions' import path",
    "AWS::Lambda::LayerVersion": "its folder on the functions' import path",
    "AWS::Serverless::Api": "the local HTTP server (authorization not enforced)",
    "AWS::Lambda::EventSourceMapping": "a local poller",
}

# Resource types with no local counterpart, and why that is acceptable.
NOT_EMULATED_TYPES = {
    "AWS::Logs::LogGroup": "function output goes to the local log files",
    "AWS::SQS::QueuePolicy": "resource policies are not enforced locally",
    "AWS::SNS::TopicPolicy": "resource policies are not enforced locally",
    "AWS::Events::EventBusPolicy": "resource policies are not enforced locally",
    "AWS::IAM::Role": "IAM is not enforced locally",
    "AWS::IAM::Policy": "IAM is not enforced locally",
    "AWS::IAM::RolePolicy": "IAM is not enforced locally",
    "AWS::IAM::ManagedPolicy": "IAM is not enforced locally",
    "AWS::Lambda::Permission": "IAM is not enforced locally",
    "AWS::Events::Archive": "no archive or replay locally",
    "AWS::CloudWatch::Alarm": "no metrics locally",
    "AWS::CloudWatch::Dashboard": "no metrics locally",
    "AWS::CloudWatch::CompositeAlarm": "no metrics locally",
    "AWS::Lambda::EventInvokeConfig": "no asynchronous invocations locally",
    "AWS::KMS::Key": "no encryption locally",
}

_QUEUE_ATTRIBUTES = (
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "DelaySeconds",
    "FifoQueue",
    "FifoThroughputLimit",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "VisibilityTimeout",
)
_TOPIC_ATTRIBUTES = ("DisplayName", "FifoTopic", "ContentBasedDeduplication")


@dataclass(frozen=True)
class ResourceLine:
    logical_id: str
    resource_type: str
    detail: str


@dataclass
class ProvisioningReport:
    created: list[ResourceLine] = field(default_factory=list)
    emulated: list[ResourceLine] = field(default_factory=list)
    not_emulated: list[ResourceLine] = field(default_factory=list)
    seeded: dict[str, int] = field(default_factory=dict)
    # Per topic: a queue subscribed to it that people and tests read, and one the console consumes.
    capture_queues: dict[str, str] = field(default_factory=dict)
    console_queues: dict[str, str] = field(default_factory=dict)


def _attribute_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _integers(document: dict[str, Any]) -> dict[str, Any]:
    # Values from template parameters arrive as strings; SQS and EventBridge want numbers.
    return {k: int(v) if isinstance(v, str) and v.isdigit() else v for k, v in document.items()}


# What Provisioner.provision creates, by type.
PROVISIONED_TYPES = frozenset(
    {
        "AWS::DynamoDB::Table",
        "AWS::SQS::Queue",
        "AWS::SNS::Topic",
        "AWS::SNS::Subscription",
        "AWS::Events::EventBus",
        "AWS::Events::Rule",
    }
)


def other_resources(
    template: Template, stood_in: Mapping[str, str]
) -> tuple[list[ResourceLine], list[ResourceLine]]:
    """The created resources provisioning does not create, each accounted for: (emulated: by their type,
    or one by one in `stood_in`, logical id -> how; not emulated, with the reason)."""
    emulated: list[ResourceLine] = []
    not_emulated: list[ResourceLine] = []
    for logical_id, resource in template.resources.items():
        resource_type = resource["Type"]
        if resource_type in PROVISIONED_TYPES or not template.is_created(logical_id):
            continue
        if logical_id in stood_in:
            emulated.append(ResourceLine(logical_id, resource_type, stood_in[logical_id]))
        elif resource_type in EMULATED_TYPES:
            emulated.append(ResourceLine(logical_id, resource_type, EMULATED_TYPES[resource_type]))
        elif resource_type in NOT_EMULATED_TYPES:
            not_emulated.append(ResourceLine(logical_id, resource_type, NOT_EMULATED_TYPES[resource_type]))
        else:
            not_emulated.append(
                ResourceLine(logical_id, resource_type, "resource type unknown to the local stack")
            )
    return emulated, not_emulated


class Provisioner:
    def __init__(
        self, template: Template, clients: AwsClients, stood_in: Mapping[str, str] | None = None
    ) -> None:
        """`stood_in`: resources another part of the local stack stands in for, by logical id, with how
        (a nested application, a custom resource): reported as emulated."""
        self.template = template
        self._stood_in = dict(stood_in or {})
        self._dynamodb: DynamoDBClient = clients.dynamodb()
        self._sqs: SQSClient = clients.sqs()
        self._sns: SNSClient = clients.sns()
        self._events: EventBridgeClient = clients.events()
        self._endpoints = clients.endpoints
        self.report = ProvisioningReport()
        self._report_lock = threading.Lock()
        self._new_tables: set[str] = set()
        self._queue_urls: dict[str, str] = {}

    @property
    def created_tables(self) -> list[str]:
        """Logical ids of the tables this provisioner created (not those kept from an earlier run)."""
        return sorted(self._new_tables)

    def provision(self, seed_file: Path | None = None) -> ProvisioningReport:
        """Create everything; DynamoDB Local (tables, then seeds) and moto are provisioned in parallel."""
        # Within each service, order matters where resources refer to each other: queues before
        # redrive policies and subscriptions, buses before rules.
        dynamodb_steps: list[tuple[str, Callable[[str], None]]] = [("AWS::DynamoDB::Table", self._table)]
        moto_steps: list[tuple[str, Callable[[str], None]]] = [
            ("AWS::SQS::Queue", self._queue),
            ("AWS::SQS::Queue", self._queue_redrive),
            ("AWS::SNS::Topic", self._topic),
            ("AWS::SNS::Subscription", self._subscription),
            ("AWS::Events::EventBus", self._event_bus),
            ("AWS::Events::Rule", self._rule),
        ]

        # other_resources accounts for every other type
        assert {resource_type for resource_type, _ in dynamodb_steps + moto_steps} == PROVISIONED_TYPES

        def run(
            steps: list[tuple[str, Callable[[str], None]]], then: Callable[[], None] | None = None
        ) -> None:
            for resource_type, step in steps:
                for logical_id in self.template.of_type(resource_type):
                    if self.template.is_created(logical_id):
                        step(logical_id)
            if then is not None:
                then()

        seed = (lambda: self.seed(seed_file)) if seed_file is not None else None
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="provision") as pool:
            for done in [pool.submit(run, dynamodb_steps, seed), pool.submit(run, moto_steps)]:
                done.result()
        order = list(self.template.resources)
        self.report.created.sort(key=lambda line: order.index(line.logical_id.split(".")[0]))
        emulated, not_emulated = other_resources(self.template, self._stood_in)
        with self._report_lock:
            self.report.emulated.extend(emulated)
            self.report.not_emulated.extend(not_emulated)
        return self.report

    # --- report -----------------------------------------------------------------------------------
    def _created(self, logical_id: str, resource_type: str, detail: str) -> None:
        with self._report_lock:
            self.report.created.append(ResourceLine(logical_id, resource_type, detail))

    def _not_emulated(self, logical_id: str, resource_type: str, reason: str) -> None:
        with self._report_lock:
            self.report.not_emulated.append(ResourceLine(logical_id, resource_type, reason))

    # --- DynamoDB ---------------------------------------------------------------------------------
    def _table(self, logical_id: str) -> None:
        kwargs = self.template.create_table_kwargs(logical_id)
        name = kwargs["TableName"]
        try:
            self._dynamodb.create_table(**kwargs)
            self._new_tables.add(logical_id)
            detail = name
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                raise
            detail = f"{name} (kept from the previous run)"
        self._wait_active(name)
        ttl = self.template.ttl_attribute(logical_id)
        if ttl is not None:
            current = self._dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
            if current.get("TimeToLiveStatus") not in {"ENABLED", "ENABLING"}:
                self._dynamodb.update_time_to_live(
                    TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl}
                )
            detail += f", TTL on {ttl}"
        stream = kwargs.get("StreamSpecification")
        if stream:
            detail += f", stream {stream['StreamViewType']}"
        self._created(logical_id, "AWS::DynamoDB::Table", detail)

    def _wait_active(self, name: str) -> None:
        deadline = time.monotonic() + _TABLE_ACTIVE_TIMEOUT_SECONDS
        while self._dynamodb.describe_table(TableName=name)["Table"]["TableStatus"] != "ACTIVE":
            if time.monotonic() > deadline:
                raise TemplateError(f"table {name} is not ACTIVE after {_TABLE_ACTIVE_TIMEOUT_SECONDS:.0f} s")
            time.sleep(0.05)

    def seed(self, path: Path = SEED_FILE) -> None:
        """Load seed data into the tables created in this run (tables kept by PERSIST=1 keep theirs).

        A section named after a table's logical id holds items in DynamoDB JSON; any other section is
        handed to the project's seed command for it (DOMAIN_SEED_COMMANDS).
        """
        if not path.exists():
            return
        seeds = json.loads(path.read_text())
        if not isinstance(seeds, dict):
            raise TemplateError(f"{path}: expected an object of section name → list")
        tables = self.template.of_type("AWS::DynamoDB::Table")
        for section, items in seeds.items():
            if section in tables:
                if section in self._new_tables:
                    self._batch_write(self.template.physical_name(section), items)
                    self.report.seeded[section] = len(items)
            elif section not in DOMAIN_SEED_COMMANDS:
                raise TemplateError(
                    f"{path}: section {section!r} is neither a table of the template nor one of "
                    f"{sorted(DOMAIN_SEED_COMMANDS)}"
                )
            elif self._new_tables == set(tables):
                self._run_seed_command(section, path)
                self.report.seeded[section] = len(items)

    def _run_seed_command(self, section: str, path: Path) -> None:
        values = {**self.template.outputs(), "file": str(path)}
        try:
            arguments = [part.format(**values) for part in DOMAIN_SEED_COMMANDS[section]]
        except KeyError as exc:
            raise TemplateError(f"seed section {section!r} needs the template output {exc}") from exc
        environment = {
            **os.environ,
            **FAKE_CREDENTIALS,
            **self._endpoints.environment(),
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "POWERTOOLS_TRACE_DISABLED": "true",
        }
        completed = subprocess.run(
            [sys.executable, *arguments],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=_SEED_COMMAND_TIMEOUT_SECONDS,
            check=False,
        )
        if completed.returncode != 0:
            output = completed.stderr or completed.stdout
            raise TemplateError(f"seeding {section!r} with {' '.join(arguments)} failed:\n{output}")

    def _batch_write(self, table: str, items: list[dict[str, Any]]) -> None:
        for start in range(0, len(items), _BATCH_WRITE_LIMIT):
            requests: list[Any] = [
                {"PutRequest": {"Item": item}} for item in items[start : start + _BATCH_WRITE_LIMIT]
            ]
            for _ in range(_BATCH_WRITE_ATTEMPTS):
                unprocessed = self._dynamodb.batch_write_item(RequestItems={table: requests})[
                    "UnprocessedItems"
                ]
                requests = list(unprocessed.get(table, []))
                if not requests:
                    break
            else:
                raise TemplateError(
                    f"seeding {table}: items still unprocessed after {_BATCH_WRITE_ATTEMPTS} tries"
                )

    # --- SQS --------------------------------------------------------------------------------------
    def _queue(self, logical_id: str) -> None:
        props = self.template.properties(logical_id)
        attributes = {name: _attribute_text(props[name]) for name in _QUEUE_ATTRIBUTES if name in props}
        name = self.template.physical_name(logical_id)
        url = self._sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
        self._queue_urls[logical_id] = url
        visibility = attributes.get("VisibilityTimeout", "30")
        self._created(logical_id, "AWS::SQS::Queue", f"{name} (visibility {visibility} s)")

    def _queue_redrive(self, logical_id: str) -> None:
        # Set after every queue exists, so a dead-letter queue defined later in the template works.
        props = self.template.properties(logical_id)
        extra = {}
        for name in ("RedrivePolicy", "RedriveAllowPolicy"):
            if name in props:
                value = props[name]
                extra[name] = json.dumps(_integers(value)) if isinstance(value, dict) else str(value)
        if not extra:
            return
        self._sqs.set_queue_attributes(QueueUrl=self._queue_urls[logical_id], Attributes=extra)  # type: ignore[arg-type]
        redrive = props.get("RedrivePolicy")
        if isinstance(redrive, dict):
            target = str(redrive.get("deadLetterTargetArn", "")).rsplit(":", 1)[-1]
            with self._report_lock:
                line = next(line for line in self.report.created if line.logical_id == logical_id)
                self.report.created[self.report.created.index(line)] = ResourceLine(
                    logical_id,
                    line.resource_type,
                    f"{line.detail}, to {target} after {redrive.get('maxReceiveCount')}",
                )

    def queue_url(self, logical_id: str) -> str:
        return self._queue_urls[logical_id]

    # --- SNS --------------------------------------------------------------------------------------
    def _topic(self, logical_id: str) -> None:
        props = self.template.properties(logical_id)
        name = self.template.physical_name(logical_id)
        attributes = {key: _attribute_text(props[key]) for key in _TOPIC_ATTRIBUTES if key in props}
        arn = self._sns.create_topic(Name=name, Attributes=attributes)["TopicArn"]
        for index, subscription in enumerate(props.get("Subscription", [])):
            self._subscribe(f"{logical_id}.Subscription[{index}]", arn, subscription)
        capture = self._capture_queue(logical_id, name, arn, "capture")
        self.report.capture_queues[logical_id] = capture
        self.report.console_queues[logical_id] = self._capture_queue(logical_id, name, arn, "console")
        self._created(
            logical_id, "AWS::SNS::Topic", f"{name} (published messages also go to queue {capture})"
        )

    def _capture_queue(self, logical_id: str, topic_name: str, topic_arn: str, purpose: str) -> str:
        fifo = topic_name.endswith(".fifo")
        queue_name = f"{topic_name.removesuffix('.fifo')}-{purpose}" + (".fifo" if fifo else "")
        attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true"} if fifo else {}
        url = self._sqs.create_queue(QueueName=queue_name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
        queue_arn = self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        self._sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn)
        return url

    def _subscription(self, logical_id: str) -> None:
        props = self.template.properties(logical_id)
        self._subscribe(logical_id, str(props["TopicArn"]), props)

    def _subscribe(self, logical_id: str, topic_arn: str, props: dict[str, Any]) -> None:
        protocol = str(props.get("Protocol", "")).lower()
        endpoint = str(props.get("Endpoint", ""))
        if protocol != "sqs":
            self._not_emulated(
                logical_id,
                "AWS::SNS::Subscription",
                f"{protocol} to {endpoint!r} is not delivered locally; read the topic's capture queue",
            )
            return
        attributes: dict[str, str] = {
            name: _attribute_text(props[name])
            for name in ("RawMessageDelivery", "FilterPolicy", "FilterPolicyScope", "RedrivePolicy")
            if name in props
        }
        self._sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=endpoint, Attributes=attributes)
        self._created(logical_id, "AWS::SNS::Subscription", f"{topic_arn.rsplit(':', 1)[-1]} → {endpoint}")

    # --- EventBridge ------------------------------------------------------------------------------
    def _event_bus(self, logical_id: str) -> None:
        name = self.template.physical_name(logical_id)
        self._events.create_event_bus(Name=name)
        self._created(logical_id, "AWS::Events::EventBus", name)

    def _rule(self, logical_id: str) -> None:
        props = self.template.properties(logical_id)
        if "ScheduleExpression" in props:
            self._not_emulated(
                logical_id,
                "AWS::Events::Rule",
                f"schedule {props['ScheduleExpression']} does not fire locally",
            )
            return
        bus = str(props.get("EventBusName", "default")).rsplit("event-bus/", 1)[-1]
        name = self.template.physical_name(logical_id)
        pattern = props.get("EventPattern")
        self._events.put_rule(
            Name=name,
            EventBusName=bus,
            EventPattern=pattern if isinstance(pattern, str) else json.dumps(pattern),
            State="DISABLED" if props.get("State") == "DISABLED" else "ENABLED",
        )
        targets = []
        for target in props.get("Targets", []):
            arn = str(target.get("Arn", ""))
            if ":sqs:" not in arn and ":sns:" not in arn and ":events:" not in arn:
                self._not_emulated(
                    f"{logical_id}.{target.get('Id')}",
                    "AWS::Events::Rule target",
                    f"{arn} is not delivered locally",
                )
                continue
            shaped = dict(target)
            for key in ("RetryPolicy", "SqsParameters"):
                if isinstance(shaped.get(key), dict):
                    shaped[key] = _integers(shaped[key])
            targets.append(shaped)
        if targets:
            self._events.put_targets(Rule=name, EventBusName=bus, Targets=targets)  # type: ignore[arg-type]
        destinations = ", ".join(str(t["Arn"]).rsplit(":", 1)[-1] for t in targets) or "no local target"
        self._created(logical_id, "AWS::Events::Rule", f"{name} on {bus} → {destinations}")
