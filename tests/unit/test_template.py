"""template.yaml: the promises docs/ makes about resources, outputs, permissions, alarms and settings.

Every test here runs for each order store (OrderStore: the module's `template` fixture), so what only
one store deploys is checked where it exists, and what the other would not deploy is checked absent.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import botocore.client
import pytest
import yaml
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

import shop.adapters.aws
import shop.runtime.wiring.order_database
from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.adapters.postgres.order_repository import PostgresOrderRepository
from shop.domain.orders import OrderLine, OrderRepository, OrderService, PlaceOrder
from shop.runtime.config import Settings
from shop.runtime.consumer import idempotency_key_prefix
from tests.support import LambdaContext, json_body, load_event, load_handler_module
from tests.support.postgres import connect
from tools.iam import (
    Access,
    Decision,
    DeployedTemplate,
    Request,
    ResourceNames,
    Statement,
    Touch,
    UnknownResource,
    decisions,
    deployed,
    local_names,
    partition_keys,
    refusals,
    touches,
)
from tools.iam.access import NETWORK_INTERFACE_ACTIONS
from tools.template import ROOT, Template, chosen, parse_yaml
from tools.template.translate import translate

# The README links to docs/; the promises about the template live in these pages.
DOCS = {
    page: (ROOT / "docs" / f"{page}.md").read_text() for page in ("reference", "operations", "configuration")
}
TEMPLATE_TEXT = (ROOT / "template.yaml").read_text()
SOURCE_TEXT = (ROOT / "template.source.yaml").read_text()  # the loops template.yaml is written out from
Grant = tuple[str, str]  # (IAM action, resource: logical id, "<logical id>.StreamArn" or "*")

STORES = ("dynamodb", "postgres")  # the template's OrderStore values
# The nested order database's outputs the postgres tests deploy against (with the session's PostgreSQL
# for where the database is); its secret keeps the reader's placeholder ARN, a secret moto holds.
NETWORK = {"SubnetIds": "subnet-0a,subnet-0b", "FunctionSecurityGroupId": "sg-0functions"}
SECRET = "OrderDatabase.Outputs.SecretArn"  # the database password's secret, in the docs' notation
# The functions that connect to the order database (OrderStore=postgres), so read its password.
DATABASE_CLIENTS = {
    "OrdersApiFunction",
    "OrderStatusFunction",
    "OutboxPublisherFunction",
    "OrderStoreMaintenanceFunction",
    "OrderDatabaseMigrationFunction",
}


@pytest.fixture(scope="module", params=STORES)
def template(request: pytest.FixtureRequest) -> Template:
    """template.yaml as deployed with each order store; with postgres, its functions reach the session's
    PostgreSQL (tests/conftest.py) as they would the nested stack's cluster."""
    if request.param == "dynamodb":
        return Template.load()
    server: ConnectionSettings = request.getfixturevalue("postgres_server")
    database = {
        "Endpoint": server.host,
        "Port": str(server.port),
        "DatabaseName": server.dbname,
        "MasterUsername": server.user,
    }
    return Template.load(
        parameters={"OrderStore": "postgres"}, application_outputs={"OrderDatabase": {**database, **NETWORK}}
    )


def store(template: Template) -> str:
    return template.parameter_values["OrderStore"]


def created(template: Template, resource_type: str) -> dict[str, dict[str, Any]]:
    """The resources of a type that the template's parameters create, their properties chosen."""
    conditions = template.conditions
    return {
        name: {**resource, "Properties": chosen(conditions, resource.get("Properties", {}))}
        for name, resource in template.of_type(resource_type).items()
        if "Condition" not in resource or conditions[resource["Condition"]]
    }


def functions(template: Template) -> list[str]:
    return list(created(template, "AWS::Serverless::Function"))


def readme_table(section: str) -> list[list[str]]:
    """The rows of a marked table (<!-- section:start/end -->) in docs/reference.md or docs/operations.md."""
    text = DOCS["operations"] if section == "alarms" else DOCS["reference"]
    block = text.split(f"<!-- {section}:start -->")[1].split(f"<!-- {section}:end -->")[0]
    rows = [line for line in block.strip().splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def execution_role(template: Template, function: str) -> dict[str, Any]:
    role = template.resources[function]["Properties"]["Role"]
    assert set(role) == {"Fn::GetAtt"}, f"{function}: Role must be a role of this template"
    logical_id, attribute = role["Fn::GetAtt"]
    assert attribute == "Arn"
    assert logical_id in created(template, "AWS::IAM::Role"), f"{function}: its role is not deployed with it"
    return dict(created(template, "AWS::IAM::Role")[logical_id]["Properties"])


def role_of(template: Template, function: str) -> str:
    return str(template.resources[function]["Properties"]["Role"]["Fn::GetAtt"][0])


def statements(template: Template, function: str) -> list[dict[str, Any]]:
    """The role's inline policies and every AWS::IAM::RolePolicy attached to it: its effective grants."""
    role = role_of(template, function)
    documents = [
        policy["PolicyDocument"] for policy in execution_role(template, function).get("Policies", [])
    ]
    for policy in created(template, "AWS::IAM::RolePolicy").values():
        if policy["Properties"]["RoleName"] == {"Ref": role}:
            documents.append(policy["Properties"]["PolicyDocument"])
    return [statement for document in documents for statement in as_list(document["Statement"])]


def resource_name(value: Any) -> str:
    """A statement's resource in docs/reference.md's notation: `Table`, `Table.StreamArn`, `*`."""
    if value == "*":
        return "*"
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return str(value["Ref"])
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        logical_id, attribute = value["Fn::GetAtt"]
        return str(logical_id) if attribute == "Arn" else f"{logical_id}.{attribute}"
    raise AssertionError(f"unexpected resource {value!r}: name it with Ref or GetAtt")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def granted(template: Template, function: str) -> set[Grant]:
    grants: set[Grant] = set()
    for statement in statements(template, function):
        assert statement["Effect"] == "Allow", statement
        # A condition may only narrow a grant to some items (a consumer's own idempotency records): the
        # grant stays the table's here, and the IAM evaluation decides on the items.
        keys = {key for test in statement.get("Condition", {}).values() for key in test}
        assert keys <= {"dynamodb:LeadingKeys"}, statement
        for action in as_list(statement["Action"]):
            for resource in as_list(statement["Resource"]):
                grants.add((action, resource_name(resource)))
    return grants


def readme_grants(cell: str) -> set[Grant]:
    """`a:X`, `a:Y` on `R1`, `R2`; `a:Z` on `*` → every (action, resource) pair the cell names."""
    grants: set[Grant] = set()
    for clause in filter(None, (part.strip() for part in cell.split(";"))):
        actions, _, resources = clause.partition(" on ")
        assert resources, f"permissions table: {clause!r} does not say on which resources"
        grants.update((a, r) for a in ticked(actions) for r in ticked(resources))
    return grants


def documented_permissions(order_store: str) -> dict[str, tuple[set[Grant], set[Grant]]]:
    """Per function a store deploys: (what its code calls, what Lambda uses to run it), from
    docs/reference.md, whose rows say for which stores (`OrderStore`) they hold."""
    documented: dict[str, tuple[set[Grant], set[Grant]]] = {}
    for name, stores, code, runtime in readme_table("permissions"):
        if order_store in ticked(stores):
            function = ticked(name)[0]
            assert function not in documented, f"{function}: two rows for OrderStore={order_store}"
            documented[function] = (readme_grants(code), readme_grants(runtime))
    return documented


def test_resources_are_the_ones_the_readme_lists(template: Template):
    documented = {ticked(name)[0]: ticked(kind)[0] for name, kind in readme_table("resources")}
    assert documented == {name: r["Type"] for name, r in template.resources.items()}


def test_outputs_are_the_ones_the_readme_lists(template: Template):
    documented = {ticked(row[0])[0] for row in readme_table("outputs")}
    assert documented == set(template.data["Outputs"])


def test_parameters_are_the_ones_the_readme_lists(template: Template):
    block = DOCS["configuration"].split("Template parameters:")[1].split("\n\n")[1]
    rows = [line for line in block.splitlines() if line.startswith("|")][2:]
    documented = {name for row in rows for name in ticked(row.split("|")[1])}
    assert documented == set(template.data["Parameters"])


def test_each_function_is_granted_exactly_what_the_readme_lists(template: Template):
    documented = {
        name: code | runtime for name, (code, runtime) in documented_permissions(store(template)).items()
    }
    assert {name: granted(template, name) for name in functions(template)} == documented


def test_roles_are_the_templates_own_with_no_managed_policies(template: Template):
    # SAM would attach AWSLambdaBasicExecutionRole, the X-Ray write policy and the event sources'
    # execution roles (all on `*`) to a role it generates from `Policies`; an explicit role gets none.
    for name in functions(template):
        assert "Policies" not in template.resources[name]["Properties"], name
        role = execution_role(template, name)
        assert "ManagedPolicyArns" not in role, name
        assert "PermissionsBoundary" not in role, name
        [trust] = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust == {
            "Effect": "Allow",
            "Principal": {"Service": "lambda.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }


def runtime_needs(template: Template, name: str) -> set[Grant]:
    """What Lambda does with a function's role, derived from the function's configuration."""
    props = template.resources[name]["Properties"]
    deployed = template.properties(name)  # Globals merged, conditions resolved
    needs: set[Grant] = {
        ("logs:CreateLogStream", props["LoggingConfig"]["LogGroup"]["Ref"]),
        ("logs:PutLogEvents", props["LoggingConfig"]["LogGroup"]["Ref"]),
    }
    if deployed.get("Tracing") == "Active":
        needs |= {("xray:PutTraceSegments", "*"), ("xray:PutTelemetryRecords", "*")}
    if deployed.get("VpcConfig"):  # its network interfaces in the VPC
        needs |= {(action, "*") for action in NETWORK_INTERFACE_ACTIONS}
    for event in props.get("Events", {}).values():
        source = event["Properties"]
        if event["Type"] == "SQS":
            queue = resource_name(source["Queue"])
            needs |= {
                (a, queue) for a in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes")
            }
        if event["Type"] == "DynamoDB":
            stream = resource_name(source["Stream"])
            reads = ("dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator")
            needs |= {(a, stream) for a in reads} | {("dynamodb:ListStreams", "*")}
        on_failure = source.get("DestinationConfig", {}).get("OnFailure")
        if on_failure:
            assert on_failure["Type"] == "SQS"
            needs.add(("sqs:SendMessage", resource_name(on_failure["Destination"])))
    return needs


def test_what_lambda_uses_follows_from_each_functions_configuration(template: Template):
    documented = {name: runtime for name, (_, runtime) in documented_permissions(store(template)).items()}
    assert {name: runtime_needs(template, name) for name in functions(template)} == documented


def document_grants(documents: list[dict[str, Any]]) -> set[Grant]:
    return {
        (action, resource_name(resource))
        for document in documents
        for statement in as_list(document["Statement"])
        for action in as_list(statement["Action"])
        for resource in as_list(statement["Resource"])
    }


def test_each_mapping_is_created_after_the_grants_lambda_checks(template: Template):
    # Lambda checks the execution role when it creates an event source mapping (reading the queue or
    # the stream, sending to the OnFailure destination), and when it creates a function in a VPC (its
    # network interfaces). A grant that comes from a policy resource rather than from the role itself
    # must exist by then: the function depends on that policy.
    for name in functions(template):
        mapping_needs = {
            (action, resource)
            for action, resource in runtime_needs(template, name)
            if action.split(":")[0] not in ("logs", "xray")  # used at run time, not checked up front
        }
        if not mapping_needs:
            continue
        role = role_of(template, name)
        waits_for = set(as_list(template.resources[name].get("DependsOn", [])))
        documents = [p["PolicyDocument"] for p in execution_role(template, name).get("Policies", [])]
        documents += [
            policy["Properties"]["PolicyDocument"]
            for logical_id, policy in created(template, "AWS::IAM::RolePolicy").items()
            if policy["Properties"]["RoleName"] == {"Ref": role} and logical_id in waits_for
        ]
        assert mapping_needs <= document_grants(documents), name


def test_wildcard_resources_only_where_aws_has_no_resource_level_permissions(template: Template):
    # (a function's network interfaces: what Lambda's own AWSLambdaVPCAccessExecutionRole grants on "*")
    unscoped = {"dynamodb:ListStreams", "xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    for name in functions(template):
        for action, resource in granted(template, name):
            if resource == "*":
                assert action in {*unscoped, *NETWORK_INTERFACE_ACTIONS}, (name, action)
    # ... and each such case says why, next to it: on the Resource line or on its statement's Action line.
    lines = TEMPLATE_TEXT.splitlines()
    for at, line in enumerate(lines):
        if re.search(r"Resource: \"\*\"", line):
            action = next(earlier for earlier in reversed(lines[:at]) if "Action:" in earlier)
            assert "#" in line or "#" in action, f"explain this wildcard in a comment: {line.strip()}"


# --- what the code really calls -----------------------------------------------------------------------
_TRANSACT_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


class CallRecorder:
    """Records every AWS call made while recording, as (IAM action, resource logical id) pairs, and as
    what IAM authorises for it (`touches`: each action on each resource ARN, with the condition keys the
    call sets; tools/iam/calls.py), with `names` turning the local names the code was given into ARNs."""

    def __init__(self, template: Template, names: ResourceNames | None = None) -> None:
        self.names = names or ResourceNames()
        self.touches: list[Touch] = []
        self.unknown: list[str] = []  # calls whose resources tools/iam/calls.py cannot name
        self.logical_ids: dict[str, str] = {}
        for logical_id in template.resources:
            self.logical_ids[template.physical_name(logical_id)] = logical_id
            self.logical_ids[template.arn(logical_id)] = logical_id
        for logical_id in template.of_type("AWS::SQS::Queue"):  # SQS calls name a queue by its URL
            self.logical_ids[str(template.resolve({"Ref": logical_id}))] = logical_id
        for app in created(template, "AWS::Serverless::Application"):  # a nested stack's outputs
            for output in template.nested_outputs(app):
                value = template.resolve({"Fn::GetAtt": [app, f"Outputs.{output}"]})
                self.logical_ids.setdefault(str(value), f"{app}.Outputs.{output}")
        self.calls: set[Grant] = set()
        self.recording = False

    def _add(self, prefix: str, action: str, resource: str) -> None:
        self.calls.add((f"{prefix}:{action}", self.logical_ids.get(resource, resource)))

    def record(self, prefix: str, operation: str, params: dict[str, Any]) -> None:
        try:  # never an error inside the code under test: the test reports it
            self.touches.extend(touches(prefix, operation, params, self.names))
        except UnknownResource as exc:
            self.unknown.append(str(exc))
        if operation == "TransactWriteItems":  # IAM authorises each action of a transaction on its own
            for item in params["TransactItems"]:
                [(kind, spec)] = item.items()
                self._add(prefix, _TRANSACT_ACTIONS[kind], spec["TableName"])
        elif operation == "TransactGetItems":
            for item in params["TransactItems"]:
                self._add(prefix, "GetItem", item["Get"]["TableName"])
        elif operation in {"BatchGetItem", "BatchWriteItem"}:
            for table in params["RequestItems"]:
                self._add(prefix, operation, table)
        elif operation == "PutEvents":
            for entry in params["Entries"]:
                self._add(prefix, operation, entry.get("EventBusName", "default"))
        else:
            named = ("TableName", "TopicArn", "QueueUrl", "SecretId")
            resource = next((params[key] for key in named if key in params), "*")
            self._add(prefix, operation, resource)

    @contextmanager
    def recording_calls(self) -> Iterator[None]:
        self.recording = True
        try:
            yield
        finally:
            self.recording = False


_DEPLOYED: dict[str, DeployedTemplate] = {}


@pytest.fixture
def as_deployed(template: Template) -> DeployedTemplate:
    """The template as CloudFormation deploys it (SAM's transform, AWS's ARNs): what IAM evaluates. Once
    per store and module (the `template` fixture is made anew for each test parametrized through it)."""
    key = json.dumps(
        [template.data, template.parameter_values, template.stack_name, template.application_outputs],
        sort_keys=True,
        default=str,
    )
    if key not in _DEPLOYED:
        _DEPLOYED[key] = deployed(template)
    return _DEPLOYED[key]


@pytest.fixture
def recorder(
    template: Template, as_deployed: DeployedTemplate, monkeypatch: pytest.MonkeyPatch
) -> CallRecorder:
    names = ResourceNames(local_names(template, as_deployed), partition_keys=partition_keys(as_deployed))
    calls = CallRecorder(template, names)
    original = botocore.client.BaseClient._make_api_call  # type: ignore[attr-defined]

    def make_api_call(client: Any, operation: str, params: dict[str, Any]) -> Any:
        if calls.recording:
            calls.record(client.meta.service_model.signing_name, operation, params)
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", make_api_call)
    return calls


def idempotency_store_calls() -> set[str]:
    """The DynamoDB actions Powertools' persistence layer can call (some only on failure paths)."""
    methods = set(re.findall(r"self\.client\.(\w+)\(", inspect.getsource(DynamoDBPersistenceLayer)))
    return {"dynamodb:" + "".join(part.title() for part in method.split("_")) for method in methods}


ORDER_ID = "o-0000000000000000000000000000a001"  # the order of the sqs_* sample events
POISONED_ORDER_ID = "o-0000000000000000000000000000a002"  # its outbox row unreadable (OrderStore=postgres)


def _settings(template: Template, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("ORDERS_TABLE_NAME", template.physical_name("OrdersTable"))
    monkeypatch.setenv("INVENTORY_TABLE_NAME", template.physical_name("InventoryTable"))
    return Settings.from_env()


def _order_database(template: Template, request: pytest.FixtureRequest) -> ConnectionSettings:
    """OrderStore=postgres: the (emptied) database the template's functions connect to, and in moto the
    secret they read its password from (the local server does not ask for it)."""
    server: ConnectionSettings = request.getfixturevalue("order_database")
    secret = template.resolve({"Fn::GetAtt": ["OrderDatabase", "Outputs.SecretArn"]})
    boto3.client("secretsmanager").create_secret(
        Name=secret, SecretString=json.dumps({"username": server.user, "password": "unused-locally"})
    )
    return server


def _connected_afresh() -> None:
    """Each function opens its connection, reading the password, as in a new execution environment."""
    shop.runtime.wiring.order_database.order_database.cache_clear()
    shop.adapters.aws.secrets_manager.cache_clear()  # and with its client, the secret's cache


def _orders_api(invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    create = load_event("api_create_order.json")
    order_id = json_body(invoke("OrdersApiFunction", create))["orderId"]
    invoke("OrdersApiFunction", create)  # a retry with the same Idempotency-Key: replayed
    for name in ("api_get_order.json", "api_cancel_order.json"):
        event = load_event(name)
        event["pathParameters"] = {"orderId": order_id}
        event["path"] = event["path"].replace("o-00000000000000000000000000000001", order_id)
        invoke("OrdersApiFunction", event)


def _relay(invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    invoke("OutboxRelayFunction", load_event("relay_outbox_insert_batch.json"))
    invoke("OutboxRelayFunction", load_event("relay_poison_record.json"))  # parks its poison record


def _inventory(invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    invoke("InventoryFunction", load_event("sqs_inventory_order_created.json"))
    invoke("InventoryFunction", load_event("sqs_inventory_order_created.json"))  # a duplicate
    invoke("InventoryFunction", load_event("sqs_inventory_order_cancelled.json"))


def _order_status(invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    invoke("OrderStatusFunction", load_event("sqs_order_status_inventory_reserved.json"))
    invoke("OrderStatusFunction", load_event("sqs_order_status_inventory_rejected.json"))


def _notification(invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("confirmed", "rejected", "cancelled"):
        invoke("NotificationFunction", load_event(f"sqs_notification_order_{name}.json"))


def _outbox_publisher(
    invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a few polling rounds, then its reserve: the sample order's event goes out, the poisoned one is parked
    # (a park is begun only with the poison queue's worst case left: the first round has it; the clock
    # runs ten times fast so that the rounds after it, which find nothing, end within seconds)
    park = shop.adapters.aws.longest_call_seconds() + shop.adapters.aws.ANSWER_SECONDS
    context = LambdaContext("OutboxPublisherFunction", timeout_seconds=park + 10, clock_speed=10)
    totals = invoke("OutboxPublisherFunction", {}, context=context)
    assert (totals["published"], totals["parked"]) == (1, 1)


def _order_store_maintenance(
    invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = invoke("OrderStoreMaintenanceFunction", {})  # what EventBridge Scheduler sends: its Input, {}
    assert report["health"]["pending"] == 2


def _order_database_migration(
    invoke: Callable[..., Any], template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CloudFormation's requests for the custom resource OrderDatabaseSchema; the answers go to its
    # presigned URL (S3's, not an action of the role), captured here
    answers: list[dict[str, Any]] = []

    def request(method: str, url: str, body: bytes, **_: Any) -> SimpleNamespace:
        answers.append(json.loads(body))
        return SimpleNamespace(status=200)

    module = load_handler_module(template.function("OrderDatabaseMigrationFunction"))
    http = SimpleNamespace(request=request)
    monkeypatch.setattr(module, "urllib3", SimpleNamespace(PoolManager=lambda: http))
    for request_type in ("Create", "Update", "Delete"):
        invoke(
            "OrderDatabaseMigrationFunction",
            {
                "RequestType": request_type,
                "ResponseURL": "https://cloudformation-custom-resource-response-useast1.s3.amazonaws.com/r",
                "StackId": f"arn:aws:cloudformation:us-east-1:123456789012:stack/{template.stack_name}/1",
                "RequestId": f"request-{request_type}",
                "LogicalResourceId": "OrderDatabaseSchema",
                "ResourceType": "Custom::OrderDatabaseSchema",
                # What CloudFormation sends: the resource's properties (RelayMode: !Ref PostgresRelay)
                "ResourceProperties": {
                    "FunctionVersion": "1",
                    "RelayMode": template.resolve(
                        template.resources["OrderDatabaseSchema"]["Properties"]["RelayMode"]
                    ),
                },
            },
        )
    assert [answer["Status"] for answer in answers] == ["SUCCESS"] * 3, answers


SCENARIOS = {
    "OrdersApiFunction": _orders_api,
    "OutboxRelayFunction": _relay,
    "InventoryFunction": _inventory,
    "OrderStatusFunction": _order_status,
    "NotificationFunction": _notification,
    "OutboxPublisherFunction": _outbox_publisher,
    "OrderStoreMaintenanceFunction": _order_store_maintenance,
    "OrderDatabaseMigrationFunction": _order_database_migration,
}
# The functions each store deploys (test_every_function_has_a_scenario holds this to the template).
COMMON_FUNCTIONS = [
    "OrdersApiFunction",
    "OutboxRelayFunction",
    "InventoryFunction",
    "OrderStatusFunction",
    "NotificationFunction",
]
FUNCTIONS_OF = {
    "dynamodb": COMMON_FUNCTIONS,
    "postgres": [
        *COMMON_FUNCTIONS,
        "OutboxPublisherFunction",
        "OrderStoreMaintenanceFunction",
        "OrderDatabaseMigrationFunction",
    ],
}


# --- what AWS would decide on each call -------------------------------------------------------------------
DENIED_BY_THE_TEST = "DeniedByTheTest"  # the Sid of the Deny statement the mutation checks add


def rebuilt(template: Template, data: dict[str, Any]) -> Template:
    """A Template on changed data, with the parameters and nested outputs it was deployed with."""
    return Template(
        data,
        parameters=template.parameter_values,
        stack_name=template.stack_name,
        application_outputs=template.application_outputs,
    )


def written_document(data: dict[str, Any], policy: str) -> dict[str, Any]:
    """The policy document as written in the template's data, by its name in a Decision:
    "<role>/<inline policy name>" or "<AWS::IAM::RolePolicy logical id>/<policy name>"."""
    logical_id, _, name = policy.partition("/")
    properties = data["Resources"][logical_id]["Properties"]
    if "PolicyDocument" in properties:
        document: dict[str, Any] = properties["PolicyDocument"]
        return document
    [inline] = [p for p in properties["Policies"] if p["PolicyName"] == name]
    written: dict[str, Any] = inline["PolicyDocument"]
    return written


def written_statement(
    conditions: dict[str, bool], document: dict[str, Any], statement: Statement
) -> tuple[list[Any], int]:
    """Where a deciding statement is written: the list holding it (a Statement list, or the Fn::If whose
    chosen branch it is) and its position there."""
    position = 0
    for at, item in enumerate(as_list(document["Statement"])):
        holder, key, written = document["Statement"], at, item
        while isinstance(written, dict) and set(written) == {"Fn::If"}:
            condition = written["Fn::If"][0]
            holder, key = written["Fn::If"], 1 if conditions[condition] else 2
            written = holder[key]
        if written == {"Ref": "AWS::NoValue"}:
            continue
        position += 1
        if (written.get("Sid") == statement.sid) if statement.sid else (position == statement.index):
            return holder, key
    raise AssertionError(f"{statement} is not written in {document}")


def without_statement(template: Template, statement: Statement) -> dict[str, Any]:
    """The template's data with one statement removed (with its policy, when it held nothing else)."""
    data = copy.deepcopy(template.data)
    assert statement.policy is not None
    document = written_document(data, statement.policy)
    holder, key = written_statement(template.conditions, document, statement)
    holder[key] = {"Ref": "AWS::NoValue"}
    if not chosen(template.conditions, as_list(document["Statement"])):  # a policy of that one statement
        logical_id, _, name = statement.policy.partition("/")
        resource = data["Resources"][logical_id]
        if resource["Type"] == "AWS::IAM::RolePolicy":
            del data["Resources"][logical_id]
            for other in data["Resources"].values():
                if logical_id in as_list(other.get("DependsOn", [])):
                    other["DependsOn"] = [d for d in as_list(other["DependsOn"]) if d != logical_id]
        else:
            policies = resource["Properties"]["Policies"]
            resource["Properties"]["Policies"] = [p for p in policies if p["PolicyName"] != name]
    return data


def narrower(aws: DeployedTemplate, arn: str) -> str:
    """A resource next to the one a call touches: a table's index, or another resource of its kind."""
    if arn.startswith("arn:aws:dynamodb:") and "/index/" not in arn:
        return f"{arn}/index/OutboxByTime"
    kind = arn[: max(arn.rfind(":"), arn.rfind("/")) + 1]
    others = sorted(a for a in (aws.arn(r) for r in aws.resources) if a.startswith(kind) and a != arn)
    return others[0] if others else f"{arn}-other"


def with_resource_narrowed(
    template: Template, aws: DeployedTemplate, statement: Statement, arn: str
) -> dict[str, Any]:
    """The template's data with the statement's resource that matches `arn` replaced by a narrower one."""
    data = copy.deepcopy(template.data)
    assert statement.policy is not None
    holder, key = written_statement(template.conditions, written_document(data, statement.policy), statement)
    written = holder[key]
    resources = as_list(written["Resource"])
    assert arn in [aws.resolve(r) for r in resources], (arn, resources)
    written["Resource"] = [narrower(aws, arn) if aws.resolve(r) == arn else r for r in resources]
    return data


def with_deny(template: Template, function: str, touch: Touch) -> dict[str, Any]:
    """The template's data with a Deny of one call added to the function's role."""
    data = copy.deepcopy(template.data)
    [policy, *_] = data["Resources"][role_of(template, function)]["Properties"]["Policies"]
    deny = {"Sid": DENIED_BY_THE_TEST, "Effect": "Deny", "Action": touch.action, "Resource": touch.resource}
    policy["PolicyDocument"]["Statement"] = [*as_list(policy["PolicyDocument"]["Statement"]), deny]
    return data


def assert_refused_once_the_grant_changes(
    template: Template, aws: DeployedTemplate, function: str, made: list[Touch], found: list[Decision]
) -> None:
    """The evaluation can fail: a call one statement of the role grants is refused once that statement
    is removed, once its resource is narrowed, and once a Deny of it is added, each change made to a
    copy of the template's data, and the refusal names the function, the action and the resource."""
    target = min(
        (d for d in found if len(d.grants) == 1 and d.grants[0].policy_type == "identity"),
        key=lambda d: (d.request.action, d.request.resource),
    )
    touch = next(
        t for t in made if (t.action, t.resource) == (target.request.action, target.request.resource)
    )
    [statement] = target.grants
    changed = {
        "statement removed": without_statement(template, statement),
        "resource narrowed": with_resource_narrowed(template, aws, statement, touch.resource),
        "Deny added": with_deny(template, function, touch),
    }
    requests: list[Request] = []
    for data in changed.values():
        [request] = Access(deployed(rebuilt(template, data))).calls(function, [touch])
        requests.append(request)
    for (change, _), decision in zip(changed.items(), decisions(requests), strict=True):
        expected = "ExplicitlyDenied" if change == "Deny added" else "ImplicitlyDenied"
        assert decision.result == expected, f"{change}: {decision}"
        assert str(decision).startswith(f"{function}: {touch.action} on {touch.resource}"), str(decision)
        if change == "Deny added":
            assert [s.sid for s in decision.denials] == [DENIED_BY_THE_TEST], str(decision)


def test_every_function_has_a_scenario(template: Template):
    assert set(FUNCTIONS_OF[store(template)]) == set(functions(template))
    assert set(SCENARIOS) == {f for names in FUNCTIONS_OF.values() for f in names}


@pytest.mark.parametrize(
    ("template", "function"),
    [(order_store, function) for order_store in STORES for function in FUNCTIONS_OF[order_store]],
    indirect=["template"],
)
def test_code_column_is_exactly_what_the_code_calls(
    function: str,
    bus: Any,
    invoke: Callable[..., Any],
    recorder: CallRecorder,
    template: Template,
    as_deployed: DeployedTemplate,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
):
    # Given what the scenarios need to exist (set up without recording): the sample order in the store
    settings = _settings(template, monkeypatch)
    DynamoInventoryRepository(settings).set_stock("SKU-RED-MUG", 10)
    DynamoInventoryRepository(settings).set_stock("SKU-BLUE-PEN", 5)
    orders: OrderRepository = DynamoOrderRepository(settings)
    if store(template) == "postgres":
        server = _order_database(template, request)
        database = Database(server)
        request.addfinalizer(database.close)
        orders = PostgresOrderRepository(database, settings)

    def place(order_id: str) -> None:
        OrderService(orders, settings, new_id=lambda: order_id).place_order(
            PlaceOrder(
                "c-1001", "USD", (OrderLine("SKU-RED-MUG", 2, 1250), OrderLine("SKU-BLUE-PEN", 1, 399))
            ),
            idempotency_key=None,
            correlation_id="corr-demo-0001",
        )

    place(ORDER_ID)
    if store(template) == "postgres":  # and an order whose event the polling publisher must park
        place(POISONED_ORDER_ID)
        with connect(server) as connection:
            connection.execute(
                "UPDATE outbox SET envelope = %s WHERE aggregate_id = %s",
                ('{"not": "a cloudevent"}', POISONED_ORDER_ID),
            )
        _connected_afresh()
    boto3.client("sns").create_topic(Name=template.physical_name("NotificationTopic"))
    boto3.client("sqs").create_queue(QueueName=template.physical_name("RelayPoisonQueue"))

    # When the function runs its sample events, under the name Lambda gives it (a consumer's idempotency
    # records are keyed by it, and its role may touch no others)
    function_name = str(as_deployed.resolve({"Ref": function}))
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", function_name)
    with recorder.recording_calls():
        SCENARIOS[function](invoke, template, monkeypatch)

    # Then its code called exactly what docs/reference.md says, on those resources
    calls = set(recorder.calls)
    made = list(recorder.touches)
    if any(e["Type"] == "SQS" for e in template.function(function).events.values()):  # a consumer
        calls |= {(action, "IdempotencyTable") for action in idempotency_store_calls()}
        # (the calls Powertools makes on failure paths only, on one of the function's own records)
        record = f"{idempotency_key_prefix(settings._replace(function_name=function_name))}#{'0' * 32}"
        made += [
            Touch(action, as_deployed.arn("IdempotencyTable"), (("dynamodb:LeadingKeys", (record,)),))
            for action in sorted(idempotency_store_calls())
        ]
    code, _ = documented_permissions(store(template))[function]
    assert calls == code

    # And AWS, evaluating the function's role as deployed (every policy attached to it, SAM's transform
    # run), allows each call on each resource it touches
    assert recorder.unknown == []
    found = decisions(Access(as_deployed).calls(function, made))
    assert found
    assert refusals(found) == []
    # ... and would refuse one once the template no longer grants it
    assert_refused_once_the_grant_changes(template, as_deployed, function, made, found)


def test_every_function_runs_python313_on_arm64_with_its_own_log_group(template: Template):
    globals_ = template.data["Globals"]["Function"]
    assert (globals_["Runtime"], globals_["Architectures"]) == ("python3.13", ["arm64"])
    for logical_id in functions(template):
        props = template.resources[logical_id]["Properties"]
        assert "Runtime" not in props, logical_id
        assert "Architectures" not in props, logical_id
        group = props["LoggingConfig"]["LogGroup"]["Ref"]
        assert template.is_created(group), f"{logical_id}: its log group is not deployed with it"
        assert template.resources[group]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_tables_are_encrypted_with_point_in_time_recovery_and_ttl(template: Template):
    for logical_id in template.of_type("AWS::DynamoDB::Table"):
        props = template.properties(logical_id)
        assert props["SSESpecification"]["SSEEnabled"] is True
        assert props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
        assert props["TimeToLiveSpecification"]["Enabled"] is True


def test_queues_are_encrypted_and_consumer_queues_redrive_to_their_dlq(template: Template):
    for logical_id in template.of_type("AWS::SQS::Queue"):
        assert template.properties(logical_id)["SqsManagedSseEnabled"] is True
    for name in ("Inventory", "OrderStatus", "Notification"):
        queue = template.resources[f"{name}Queue"]["Properties"]
        assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {
            "Fn::GetAtt": [f"{name}DeadLetterQueue", "Arn"]
        }
        [target] = template.resources[f"{name}Rule"]["Properties"]["Targets"]
        assert target["RetryPolicy"]["MaximumRetryAttempts"] > 0
        assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": [f"{name}DeadLetterQueue", "Arn"]}


def test_queue_policies_let_only_their_own_rule_send(template: Template):
    for name in ("Inventory", "OrderStatus", "Notification"):
        [statement] = template.resources[f"{name}QueuePolicy"]["Properties"]["PolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "events.amazonaws.com"}
        assert statement["Condition"]["ArnEquals"]["aws:SourceArn"] == {"Fn::GetAtt": [f"{name}Rule", "Arn"]}


DAY = 86_400


def retention_days(template: Template, queue: str) -> float:
    return int(template.properties(queue)["MessageRetentionPeriod"]) / DAY


def test_visibility_timeout_fits_the_consumer_timeout(template: Template):
    for name in ("Inventory", "OrderStatus", "Notification"):
        visibility = template.properties(f"{name}Queue")["VisibilityTimeout"]
        assert visibility >= 6 * template.function(f"{name}Function").timeout


def test_every_queued_or_parked_message_still_finds_its_events_in_the_table(template: Template):
    # A relay dead-letter or poison message can be redriven until its queue drops it; its records
    # arrived in the stream up to 24 h before. The outbox TTL's floor must outlive both, with a margin.
    floor = template.data["Parameters"]["OutboxTtlDays"]["MinValue"]
    for queue in ("RelayDeadLetterQueue", "RelayPoisonQueue"):
        assert floor >= retention_days(template, queue) + 1 + 1
    assert int(template.parameter_values["OutboxTtlDays"]) >= floor


def test_consumers_remember_event_ids_for_the_whole_republish_window(template: Template):
    # Redrive, replay and the bus archive can republish an event until the outbox TTL; EventBridge may
    # then retry its delivery to the queue for up to MaximumEventAgeInSeconds, and the message wait out its
    # queue's and its DLQ's retention before a consumer sees it.
    ttl_days = int(template.data["Parameters"]["OutboxTtlDays"]["MinValue"])
    assert template.resources["EventBusArchive"]["Properties"]["RetentionDays"] == {"Ref": "OutboxTtlDays"}
    for name in ("Inventory", "OrderStatus", "Notification"):
        env = template.function(f"{name}Function").environment
        settings = Settings.from_env({**env, "OUTBOX_TTL_DAYS": str(ttl_days)})
        [target] = template.properties(f"{name}Rule")["Targets"]
        window = (
            ttl_days
            + int(target["RetryPolicy"]["MaximumEventAgeInSeconds"]) / DAY
            + retention_days(template, f"{name}Queue")
            + retention_days(template, f"{name}DeadLetterQueue")
        )
        assert settings.idempotency_expires_after_seconds >= window * DAY
        assert env["OUTBOX_TTL_DAYS"] == template.parameter_values["OutboxTtlDays"]


def test_transient_relay_failures_wait_in_order_until_the_record_age_limit(template: Template):
    assert int(template.parameter_values["RelayMaximumRetryAttempts"]) == -1
    age = int(template.parameter_values["RelayMaximumRecordAgeSeconds"])
    assert 20 * 3600 <= age < 24 * 3600  # the last resort fires before the stream trims the record
    assert int(template.parameter_values["RelayParallelizationFactor"]) == 1  # docs/guarantees.md "Ordering"


@pytest.mark.parametrize("event", ["OrdersOutbox", "InventoryOutbox"])
def test_relay_stream_mappings_report_item_failures_and_dead_letter(template: Template, event: str):
    props = template.function("OutboxRelayFunction").events[event]["Properties"]
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["BisectBatchOnFunctionError"] is True
    assert int(props["MaximumRecordAgeInSeconds"]) < 24 * 3600
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == template.arn("RelayDeadLetterQueue")


@pytest.mark.parametrize("snap_start", ["None", "PublishedVersions"])
def test_what_a_schedule_starts_is_neither_retried_nor_queued_by_lambda(snap_start: str):
    # EventBridge Scheduler invokes Lambda asynchronously: without an event invoke config on what it
    # invokes (the alias `live` with SnapStart, the unqualified function, $LATEST, without), Lambda retries
    # a failed start twice and keeps a throttled one for 6 hours, piling starts onto the next minute's.
    # Read from the template CloudFormation receives after SAM's transform (tools/template/translate.py).
    stack = translate({"OrderStore": "postgres", "SnapStart": snap_start})
    resources = stack.resources
    started = set()  # (function, qualifier) of every schedule's target
    for schedule in (r for r in resources.values() if r["Type"] == "AWS::Scheduler::Schedule"):
        target = schedule["Properties"]["Target"]["Arn"]
        if "Ref" in target:  # an alias
            alias = resources[target["Ref"]]
            assert alias["Type"] == "AWS::Lambda::Alias"
            started.add((alias["Properties"]["FunctionName"]["Ref"], alias["Properties"]["Name"]))
        else:
            started.add((target["Fn::GetAtt"][0], "$LATEST"))
    assert {"OutboxPublisherFunction", "OrderStoreMaintenanceFunction"} <= {name for name, _ in started}
    configs = {
        (r["Properties"]["FunctionName"]["Ref"], r["Properties"]["Qualifier"]): r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::EventInvokeConfig"
    }
    for function, qualifier in started:
        config = configs.get((function, qualifier))
        assert config is not None, (function, qualifier, sorted(configs))
        assert config["MaximumRetryAttempts"] == 0, function
        assert config["MaximumEventAgeInSeconds"] <= 60, function
        assert not config.get("DestinationConfig"), function  # none: the roles need no grant for one


@pytest.mark.parametrize("snap_start", ["None", "PublishedVersions"])
def test_the_migration_runs_once_per_cloudformation_request_not_retried_by_lambda(snap_start: str):
    # CloudFormation invokes the custom resource's function asynchronously: with Lambda's defaults, a timed-
    # out or failed run is run again (twice, for up to 6 hours), and a late run of an old Update, after
    # its rollback's, switches the relay back while the stack says otherwise. The config must be on what
    # the ServiceToken invokes (the alias `live`).
    resources = translate({"OrderStore": "postgres", "SnapStart": snap_start}).resources
    alias = resources[resources["OrderDatabaseSchema"]["Properties"]["ServiceToken"]["Ref"]]
    assert alias["Type"] == "AWS::Lambda::Alias"
    invoked = (alias["Properties"]["FunctionName"]["Ref"], alias["Properties"]["Name"])
    configs = {
        (r["Properties"]["FunctionName"]["Ref"], r["Properties"]["Qualifier"]): r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::Lambda::EventInvokeConfig"
    }
    config = configs.get(invoked)
    assert config is not None, (invoked, sorted(configs))
    assert config["MaximumRetryAttempts"] == 0
    assert config["MaximumEventAgeInSeconds"] <= 60
    assert not config.get("DestinationConfig")


def test_api_auth_is_iam_by_default_and_none_is_allowed(template: Template):
    spec = template.data["Parameters"]["ApiAuthType"]
    assert spec["Default"] == "AWS_IAM"
    assert spec["AllowedValues"] == ["AWS_IAM", "NONE"]
    assert template.properties("OrdersApi")["Auth"] == {"DefaultAuthorizer": "AWS_IAM"}
    assert "Auth" not in Template(template.data, {"ApiAuthType": "NONE"}).properties("OrdersApi")


def test_every_sample_event_is_used_by_a_test():
    sources = "\n".join(path.read_text() for path in (ROOT / "tests").rglob("*.py"))
    unused = [p.name for p in sorted((ROOT / "events").glob("*.json")) if p.name not in sources]
    assert unused == []


# --- alarms, their topic and the dashboard -------------------------------------------------------------
def alarms(template: Template) -> dict[str, dict[str, Any]]:
    """The alarms the template's parameters deploy, by logical id: their properties, conditions chosen."""
    return {name: r["Properties"] for name, r in created(template, "AWS::CloudWatch::Alarm").items()}


def alarm_name(template: Template, props: dict[str, Any]) -> str:
    """An alarm's name without the stack name it starts with."""
    name = str(template.resolve(props["AlarmName"]))
    assert name.startswith(f"{template.stack_name}-"), name
    return name.removeprefix(f"{template.stack_name}-")


def alarms_on(template: Template, namespace: str, metric: str) -> dict[str, dict[str, Any]]:
    """Alarms on one metric, keyed by their single dimension's (raw) value (metric math alarms aside)."""
    found: dict[str, dict[str, Any]] = {}
    for props in alarms(template).values():
        if (props.get("Namespace"), props.get("MetricName")) == (namespace, metric):
            [dimension] = props["Dimensions"]
            found[resource_name(dimension["Value"])] = props
    return found


def dead_letter_queues(template: Template) -> set[str]:
    queues = {"RelayDeadLetterQueue", "RelayPoisonQueue"}
    for props in (template.resources[q]["Properties"] for q in template.of_type("AWS::SQS::Queue")):
        if "RedrivePolicy" in props:
            queues.add(resource_name(props["RedrivePolicy"]["deadLetterTargetArn"]))
    return queues


def consumer_queues(template: Template) -> set[str]:
    return {q for q, r in template.of_type("AWS::SQS::Queue").items() if "RedrivePolicy" in r["Properties"]}


def test_every_alarm_notifies_the_alarm_topic_and_carries_the_stack_name(template: Template):
    assert len(alarms(template)) == {"dynamodb": 21, "postgres": 24}[store(template)]
    for name, props in alarms(template).items():
        # one metric, or metric math whose one returned series is what the threshold applies to
        assert ("MetricName" in props) != ("Metrics" in props), name
        returned = [m for m in props.get("Metrics", []) if m.get("ReturnData", True)]
        assert len(returned) == (1 if "Metrics" in props else 0), name
        assert props["AlarmActions"] == [{"Ref": "AlarmTopic"}], name
        assert props["OKActions"] == [{"Ref": "AlarmTopic"}], name
        assert props["TreatMissingData"] == "notBreaching", name
        # the topic policy admits alarms named <stack>-*, and the runbook is named in the description
        sub = props["AlarmName"]["Fn::Sub"]
        assert (sub if isinstance(sub, str) else sub[0]).startswith("${AWS::StackName}-"), name
        assert alarm_name(template, props)
        assert "Runbook: docs/operations.md" in template.resolve(props["AlarmDescription"]), name


def test_any_message_in_a_dead_letter_queue_alarms(template: Template):
    on_depth = alarms_on(template, "AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert set(on_depth) == {f"{q}.QueueName" for q in dead_letter_queues(template)}
    for props in on_depth.values():
        assert (props["Statistic"], props["ComparisonOperator"], props["Threshold"]) == (
            "Maximum",
            "GreaterThanThreshold",
            0,
        )


def test_each_consumer_queues_oldest_message_age_alarms(template: Template):
    on_age = alarms_on(template, "AWS/SQS", "ApproximateAgeOfOldestMessage")
    assert set(on_age) == {f"{q}.QueueName" for q in consumer_queues(template)}
    for props in on_age.values():
        assert props["Threshold"] == {"Ref": "ConsumerQueueAgeThresholdSeconds"}


def deploy_time_functions(template: Template) -> set[str]:
    """Functions CloudFormation alone invokes (a custom resource's service token, no event source): a
    failure fails the deploy that ran them, which says so itself."""
    tokens = {
        resource_name(resource["Properties"]["ServiceToken"]).split(".")[0]
        for resource in template.resources.values()
        if resource["Type"].startswith("Custom::") and "ServiceToken" in resource["Properties"]
    }
    return {name for name in tokens & set(functions(template)) if not template.function(name).events}


def scheduled_functions(template: Template) -> set[str]:
    return {
        name
        for name in functions(template)
        if template.function(name).events
        and all(e["Type"] in ("Schedule", "ScheduleV2") for e in template.function(name).events.values())
    }


def test_each_function_has_error_and_throttle_alarms(template: Template):
    run_time = set(functions(template)) - deploy_time_functions(template)
    # EventBridge Scheduler starts a scheduled function asynchronously: Lambda keeps a throttled start and
    # retries it, and the next start comes a minute later; a publisher held back shows as the age of the
    # outbox's oldest pending row (test_outbox_age_alarms_on_each_publishing_path).
    expected = {"Errors": run_time, "Throttles": run_time - scheduled_functions(template)}
    assert (
        deploy_time_functions(template)
        == {"dynamodb": set(), "postgres": {"OrderDatabaseMigrationFunction"}}[store(template)]
    )
    for metric, names in expected.items():
        on_metric = alarms_on(template, "AWS/Lambda", metric)
        assert set(on_metric) == names, metric
        for props in on_metric.values():
            assert (props["Statistic"], props["Threshold"]) == ("Sum", 0)


def test_relay_iterator_age_alarms_above_the_threshold_parameter(template: Template):
    # IteratorAge is published per function (both stream mappings feed one relay), so one alarm on its
    # Maximum covers both streams.
    stream_readers = {
        name
        for name in functions(template)
        if any(e["Type"] == "DynamoDB" for e in template.function(name).events.values())
    }
    on_age = alarms_on(template, "AWS/Lambda", "IteratorAge")
    assert set(on_age) == stream_readers == {"OutboxRelayFunction"}
    props = on_age["OutboxRelayFunction"]
    assert props["Statistic"] == "Maximum"
    assert props["Threshold"] == {"Ref": "RelayIteratorAgeThresholdMs"}


def test_outbox_age_alarms_on_each_publishing_path(template: Template):
    # The stream relay's lag is the mappings' IteratorAge (above); the polling publisher's, with
    # postgres, is the age of the oldest row it has not published, which the maintenance function
    # reports every minute in seconds: alarmed on, in ms, above the same threshold.
    math = {name: props for name, props in alarms(template).items() if "Metrics" in props}
    if store(template) == "dynamodb":
        # A relay not running at all reports no IteratorAge: orders created while it publishes nothing.
        [(name, props)] = math.items()
        assert name == "RelayStoppedAlarm"
        read = {m["Id"]: m["MetricStat"] for m in props["Metrics"] if "MetricStat" in m}
        [returned] = [m for m in props["Metrics"] if m.get("ReturnData", True)]
        assert returned["Expression"] == "IF(FILL(created, 0) > 0 AND FILL(published, 0) == 0, 1, 0)"
        for metric_id, function, metric_name in (
            ("created", "OrdersApiFunction", "OrdersCreated"),
            ("published", "OutboxRelayFunction", "EventsPublished"),
        ):
            metric, environment = read[metric_id]["Metric"], template.function(function).environment
            assert template.resolve(metric["Namespace"]) == environment["POWERTOOLS_METRICS_NAMESPACE"]
            assert metric["MetricName"] == metric_name
            assert metric_name in emitted_metrics()
            [dimension] = metric["Dimensions"]
            assert (dimension["Name"], template.resolve(dimension["Value"])) == (
                "service",
                environment["POWERTOOLS_SERVICE_NAME"],
            )
            assert read[metric_id]["Stat"] == "Sum"
        assert (props["Threshold"], props["ComparisonOperator"]) == (0, "GreaterThanThreshold")
        return
    [(name, props)] = math.items()
    assert name == "OutboxPendingAgeAlarm"
    [returned] = [m for m in props["Metrics"] if m.get("ReturnData", True)]
    [read] = [m for m in props["Metrics"] if "MetricStat" in m]
    assert returned["Expression"] == f"{read['Id']} * 1000"  # seconds -> ms
    metric = read["MetricStat"]["Metric"]
    maintenance = template.function("OrderStoreMaintenanceFunction").environment
    assert template.resolve(metric["Namespace"]) == maintenance["POWERTOOLS_METRICS_NAMESPACE"]
    assert metric["MetricName"] in emitted_metrics()
    [dimension] = metric["Dimensions"]
    assert (dimension["Name"], template.resolve(dimension["Value"])) == (
        "service",
        maintenance["POWERTOOLS_SERVICE_NAME"],
    )
    assert read["MetricStat"]["Stat"] == "Maximum"
    assert props["Threshold"] == {"Ref": "RelayIteratorAgeThresholdMs"}
    assert props["ComparisonOperator"] == "GreaterThanThreshold"


def test_the_outbox_table_size_alarms_with_postgres(template: Template):
    # Retention falling behind: the row count the maintenance function reports, above a parameter.
    on_rows = {
        name: props for name, props in alarms(template).items() if props.get("MetricName") == "OutboxRows"
    }
    if store(template) == "dynamodb":
        assert on_rows == {}
        return
    [props] = on_rows.values()
    maintenance = template.function("OrderStoreMaintenanceFunction").environment
    assert template.resolve(props["Namespace"]) == maintenance["POWERTOOLS_METRICS_NAMESPACE"]
    assert "OutboxRows" in emitted_metrics()
    [dimension] = props["Dimensions"]
    assert (dimension["Name"], template.resolve(dimension["Value"])) == (
        "service",
        maintenance["POWERTOOLS_SERVICE_NAME"],
    )
    assert (props["Statistic"], props["ComparisonOperator"]) == ("Maximum", "GreaterThanThreshold")
    assert props["Threshold"] == {"Ref": "OutboxRowsThreshold"}


def test_api_5xx_rate_alarm_watches_the_apis_stage(template: Template):
    [props] = [p for p in alarms(template).values() if p.get("MetricName") == "5XXError"]
    dimensions = {d["Name"]: template.resolve(d["Value"]) for d in props["Dimensions"]}
    assert dimensions == {"ApiName": template.properties("OrdersApi")["Name"], "Stage": "dev"}
    assert props["Statistic"] == "Average"  # the share of requests answered 5xx
    assert props["Threshold"] == {"Ref": "ApiServerErrorRateThreshold"}


def test_alarm_topic_uses_a_key_cloudwatch_may_use_and_only_this_stacks_alarms_publish(template: Template):
    assert template.resources["AlarmTopic"]["Properties"]["KmsMasterKeyId"] == {"Ref": "AlarmTopicKey"}
    key = template.resources["AlarmTopicKey"]["Properties"]
    assert key["EnableKeyRotation"] is True
    [cloudwatch] = [
        s for s in key["KeyPolicy"]["Statement"] if s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    ]
    assert set(cloudwatch["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    [publish] = template.resources["AlarmTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert publish["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert publish["Action"] == "sns:Publish"
    assert template.resolve(publish["Condition"]["ArnLike"]["aws:SourceArn"]).endswith(":alarm:local-*")


def test_alarm_email_is_subscribed_only_when_given(template: Template):
    subscription = template.resources["AlarmEmailSubscription"]
    assert subscription["Condition"] == "HasAlarmEmail"
    assert template.conditions["HasAlarmEmail"] is False
    given = Template(template.data, {"AlarmEmail": "oncall@example.com"})
    assert given.conditions["HasAlarmEmail"] is True
    assert given.properties("AlarmEmailSubscription")["Endpoint"] == "oncall@example.com"


def emitted_metrics() -> set[str]:
    """Names of the EMF metrics the code emits (an f-string name counts by its fixed prefix)."""
    sources = [*(ROOT / "layers/shared/shop").rglob("*.py"), *(ROOT / "functions").glob("*/app.py")]
    text = "\n".join(path.read_text() for path in sources)
    return set(re.findall(r'add_metric\(\s*name=f?"([A-Za-z]+)', text))


def test_metrics_namespace_is_a_parameter_shared_by_functions_and_dashboard(template: Template):
    namespace = template.data["Globals"]["Function"]["Environment"]["Variables"][
        "POWERTOOLS_METRICS_NAMESPACE"
    ]
    assert namespace == {"Fn::Sub": "${MetricsNamespace}-${Stage}"}
    body, _variables = template.resources["OperationsDashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    assert "${MetricsNamespace}-${Stage}" in body


def components(template: Template) -> dict[str, dict[str, Any]]:
    return dict(template.data["Mappings"]["Components"])


def consumers(template: Template) -> dict[str, dict[str, Any]]:
    """The consumers: the rows of Mappings.Components that define one (they have code)."""
    return {key: row for key, row in components(template).items() if "CodeUri" in row}


def test_dashboard_names_no_consumer_and_finds_every_queue_and_function_by_search(template: Template):
    body_text = template.properties("OperationsDashboard")["DashboardBody"]
    widgets = json.loads(body_text)["widgets"]
    # Adding a consumer needs no edit here: no widget names one.
    for key, row in consumers(template).items():
        assert key not in body_text, key
        assert row["Service"] not in body_text, key

    namespace = template.function("OrdersApiFunction").environment["POWERTOOLS_METRICS_NAMESPACE"]
    metrics = [m for w in widgets if w["type"] == "metric" for m in w["properties"]["metrics"]]
    plotted = {(m[0], m[1]) for m in metrics if isinstance(m[0], str)}
    expressions = [m[0]["expression"] for m in metrics if isinstance(m[0], dict)]
    searched = set(re.findall(r'MetricName=\\?"?(\w+)', " ".join(expressions)))

    # The API's and the relay's saga metrics by name; the consumers' by a search over their service.
    api_and_relay = {"OrdersCreated", "OrdersCancelled", "EventsPublished", "PoisonRecords", "RelayLag"}
    assert {(namespace, name) for name in api_and_relay} <= plotted
    for metric in ("MessagesFailed", "DuplicatesSkipped"):
        assert any(f'{{"{namespace}",service}} MetricName="{metric}"' in e for e in expressions), metric
    assert "PublishFailed" in searched  # one series per failure code
    # every metric the dashboard reads from the namespace is one the code emits
    emitted = emitted_metrics()
    assert {name for ns, name in plotted if ns == namespace} | {
        "MessagesFailed",
        "DuplicatesSkipped",
    } <= emitted
    assert "PublishFailed" in emitted

    # Queues and functions by the stack's name (CloudFormation names them <stack>-<LogicalId>-<suffix>):
    # consumer queues are the stack's queues that are neither dead-letter nor poison queues.
    stack = template.stack_name
    queue_searches = [e for e in expressions if "{AWS/SQS,QueueName}" in e]
    assert all(f"QueueName={stack} " in e for e in queue_searches)
    consumer_filter = "NOT DeadLetterQueue NOT PoisonQueue"
    dlq_filter = "(DeadLetterQueue OR PoisonQueue)"
    for metric in ("ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage"):
        assert any(metric in e and consumer_filter in e for e in queue_searches), metric
    assert any("ApproximateNumberOfMessagesVisible" in e and dlq_filter in e for e in queue_searches)
    for queue in template.of_type("AWS::SQS::Queue"):
        is_dead_letter = "DeadLetterQueue" in queue or "PoisonQueue" in queue
        assert is_dead_letter == (queue in dead_letter_queues(template)), queue
        assert is_dead_letter != (queue in consumer_queues(template)), queue
    for metric in ("Errors", "Throttles"):
        assert any(
            "{AWS/Lambda,FunctionName}" in e
            and f'MetricName=\\"{metric}\\"' in json.dumps(e)
            and f"FunctionName={stack}'" in e
            for e in expressions
        ), metric
    assert {("AWS/Lambda", "IteratorAge"), ("AWS/ApiGateway", "5XXError")} <= plotted

    # The alarm widget takes ARNs only: it lists the alarms that exist once per stack, all of them, and
    # the text links to every alarm by the stack's prefix (the topic policy's ${AWS::StackName}-*).
    [alarm_widget] = [w for w in widgets if w["type"] == "alarm"]
    per_consumer = {a for a in alarms(template) if any(a.startswith(key) for key in consumers(template))}
    once_per_stack = {template.arn(a) for a in alarms(template) if a not in per_consumer}
    [text] = [w for w in widgets if w["type"] == "text"]
    assert f"search `{stack}-`" in text["properties"]["markdown"]
    assert set(alarm_widget["properties"]["alarms"]) <= once_per_stack
    assert once_per_stack - set(alarm_widget["properties"]["alarms"]) == set()


# --- one definition per consumer and per alarm kind ------------------------------------------------------
CONSUMER_RESOURCES = (
    "Queue",
    "DeadLetterQueue",
    "Rule",
    "QueuePolicy",
    "SourcePolicy",
    "IdempotencyPolicy",
    "FunctionRole",
    "Function",
    "LogGroup",
    "EffectPolicy",
    "QueueAgeAlarm",
    "DeadLetterQueueAlarm",
    "ErrorsAlarm",
    "ThrottlesAlarm",
)


def test_every_consumer_row_gets_the_whole_consumer(template: Template):
    assert set(consumers(template)) == {"Inventory", "OrderStatus", "Notification"}
    for key, row in consumers(template).items():
        for part in CONSUMER_RESOURCES:
            assert f"{key}{part}" in template.resources, f"{key}{part}"
        assert {f"{key}QueueUrl", f"{key}DeadLetterQueueUrl"} <= set(template.data["Outputs"])
        rule = template.properties(f"{key}Rule")
        assert rule["EventPattern"] == {"source": row["Sources"], "detail-type": row["DetailTypes"]}
        assert template.function(f"{key}Function").code_uri == ROOT / row["CodeUri"]


def test_each_function_is_named_by_its_row_in_logs_metrics_and_alarms(template: Template):
    for name, spec in ((name, template.function(name)) for name in functions(template)):
        service = components(template)[name.removesuffix("Function")]["Service"]
        assert spec.environment["POWERTOOLS_SERVICE_NAME"] == service, name
        group = template.resources[name]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert template.properties(group)["LogGroupName"] == f"/{template.stack_name}/{service}", name


def test_the_functions_roles_the_tables_the_consumer_and_each_alarm_kind_are_written_once():
    raw = parse_yaml(SOURCE_TEXT)  # the source, its Fn::ForEach loops as written (template.yaml repeats them)

    def written(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if "Type" in node and "Properties" in node:
                yield node
            for value in node.values():
                yield from written(value)
        elif isinstance(node, list):
            for item in node:
                yield from written(item)

    resources = list(written(raw["Resources"]))
    outbox_tables = [r for r in resources if "StreamSpecification" in r["Properties"]]
    assert [r["Type"] for r in outbox_tables] == ["AWS::DynamoDB::Table"]
    # every function's execution role and log group: one definition for the functions every deploy has,
    # one for those only OrderStore=postgres has (a condition applies to a whole loop)
    for kind in ("AWS::IAM::Role", "AWS::Logs::LogGroup"):
        assert sorted(str(r.get("Condition")) for r in resources if r["Type"] == kind) == [
            "None",
            "UsePostgres",
        ]
    # ... the second role being the first as postgres deploys it, plus the database password
    [base, postgres_only] = sorted(
        (r for r in resources if r["Type"] == "AWS::IAM::Role"), key=lambda r: "Condition" in r
    )
    with_postgres = Template.load(parameters={"OrderStore": "postgres"})

    def statements_of(role: dict[str, Any]) -> list[dict[str, Any]]:
        [policy] = role["Properties"]["Policies"]
        return list(chosen(with_postgres.conditions, policy["PolicyDocument"]["Statement"]))

    password = {
        "Sid": "ReadOrderDatabasePassword",
        "Effect": "Allow",
        "Action": "secretsmanager:GetSecretValue",
        "Resource": {"Fn::GetAtt": ["OrderDatabase", "Outputs.SecretArn"]},
    }
    assert statements_of(postgres_only) == [*statements_of(base), password]
    kinds = Counter(
        (r["Properties"].get("MetricName"), r.get("Condition"))
        for r in resources
        if r["Type"] == "AWS::CloudWatch::Alarm"
    )
    for metric in ("Errors", "Throttles", "ApproximateAgeOfOldestMessage"):
        assert kinds[(metric, None)] == 1, metric
    assert kinds[("Errors", "UsePostgres")] == 1  # the postgres-only functions' errors alarm
    # DLQ depth once; the relay's poison queue has its own alarm (another runbook entry)
    assert kinds[("ApproximateNumberOfMessagesVisible", None)] == 2
    queue_consumers = [
        r
        for r in resources
        if r["Type"] == "AWS::Serverless::Function"
        and any(e["Type"] == "SQS" for e in r["Properties"].get("Events", {}).values())
    ]
    assert len(queue_consumers) == 1


# --- security scanning ---------------------------------------------------------------------------------
def test_every_checkov_skip_is_in_one_config_with_its_reason_and_the_expanded_template_is_scanned(
    template: Template,
):
    text = (ROOT / ".checkov.yaml").read_text()
    skips = yaml.safe_load(text)["skip-check"]
    assert skips, "no skip found: is .checkov.yaml still read?"
    lines = text.splitlines()
    for check in skips:
        assert re.fullmatch(r"CKV2?_AWS_\d+", check), check
        [at] = [n for n, line in enumerate(lines) if line.strip() == f"- {check}"]
        reason = []
        while at > 0 and lines[at - 1].strip().startswith("#"):
            at -= 1
            reason.append(lines[at])
        assert len(" ".join(reason)) >= 40, f"{check}: say why it does not apply, in a comment above it"
    # One place: no resource carries its own suppression any more.
    for name, resource in template.resources.items():
        assert "checkov" not in resource.get("Metadata", {}), name
    # checkov does not expand Fn::ForEach: the Makefile scans SAM CLI's expansion, with this config.
    makefile = (ROOT / "Makefile").read_text()
    assert "tools.template.expand template.yaml $(EXPANDED)" in makefile
    assert "--config-file .checkov.yaml --file $(EXPANDED)" in makefile
    assert "--soft-fail" not in makefile


def test_the_configuration_pages_variable_table_lists_every_variable_config_reads():
    # Every upper-case string literal of shop/runtime/config.py is a variable it reads.
    config = (ROOT / "layers" / "shared" / "shop" / "runtime" / "config.py").read_text()
    read = set(re.findall(r'"([A-Z][A-Z0-9_]{2,})"', config))
    assert {"ORDERS_TABLE_NAME", "TRACE_SDK_CALLS"} <= read
    page = (ROOT / "docs" / "configuration.md").read_text()
    table = page.split("| Variable | Used by | Meaning |", 1)[1].split("\n\n", 1)[0]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    listed = {name for cell in first_cells for name in re.findall(r"`([A-Z][A-Z0-9_*]*)`", cell)}
    assert sorted(read - listed) == []


def make_with_stand_ins(
    tmp_path: Path, *command: str, **environment: str
) -> subprocess.CompletedProcess[str]:
    """`make <command>` with the tools it runs replaced by scripts that print their name and the
    AWS_DEFAULT_REGION they were given ("unset" when none), the stamps taken as made (nothing is
    installed), and no variable of an outer make or shell that would choose for it."""
    for tool in ("python", "sam", "pytest"):
        script = tmp_path / tool
        script.write_text(f'#!/bin/sh\necho "{tool} ${{AWS_DEFAULT_REGION-unset}}"\n')
        script.chmod(0o755)
    stamps = [".venv/.installed", "tools/local/node_modules/.installed", "tools/iam/node_modules/.installed"]
    outer = ("AWS_DEFAULT_REGION", "STACK_NAME", "STACK", "LOCAL", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    env = {**{k: v for k, v in os.environ.items() if k not in outer}, **environment}
    return subprocess.run(
        ["make", "-s", *[f"--old-file={stamp}" for stamp in stamps], *command, f"BIN={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def region_each_target_runs_with(tmp_path: Path, *command: str, **environment: str) -> list[str]:
    completed = make_with_stand_ins(tmp_path, *command, **environment)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.splitlines()


def test_make_gives_a_region_only_to_what_reaches_no_account_and_never_overrides_the_users(tmp_path: Path):
    # What talks to a real account gets the profile's region: AWS_DEFAULT_REGION would win over it.
    assert region_each_target_runs_with(tmp_path, "replay", "STACK=shop", "FROM=a", "TO=b") == [
        "python unset"
    ]
    assert region_each_target_runs_with(tmp_path, "seed", "STACK=shop") == ["python unset"]
    assert region_each_target_runs_with(tmp_path, "deploy")[-1] == "sam unset"  # after its sam build
    assert region_each_target_runs_with(tmp_path, "test-e2e") == ["pytest unset"]
    # What runs on this machine alone gets one, unless the shell has its own
    assert region_each_target_runs_with(tmp_path, "test-unit") == ["pytest us-east-1"]
    assert region_each_target_runs_with(tmp_path, "invoke", "FUNCTION=F", "EVENT=e") == ["python us-east-1"]
    mine = region_each_target_runs_with(tmp_path, "test-unit", AWS_DEFAULT_REGION="eu-west-1")
    assert mine == ["pytest eu-west-1"]


@pytest.mark.parametrize("target", ["redrive", "redrive-poison", "replay", "seed", "redrive-dlq"])
def test_the_operator_targets_say_they_need_stack_or_local_and_take_either(tmp_path: Path, target: str):
    listed = make_with_stand_ins(tmp_path, "help").stdout
    [help_line] = [line for line in listed.splitlines() if line.split()[1:2] == [target]]
    assert "STACK=" in help_line
    assert "LOCAL=1" in help_line

    refused = make_with_stand_ins(tmp_path, target, "CONSUMER=Inventory")

    assert refused.returncode == 2
    assert "STACK=<stack name> (or LOCAL=1 for the running make local)" in refused.stdout
    assert "python" not in refused.stdout  # the command never ran
    for choice in ("STACK=shop", "LOCAL=1"):
        ran = make_with_stand_ins(tmp_path, target, "CONSUMER=Inventory", choice)
        assert (ran.returncode, ran.stdout.splitlines()[-1].split()[0]) == (0, "python"), ran.stdout


def test_every_alarm_has_a_runbook_entry_in_the_readme(template: Template):
    documented = {ticked(alarm)[0]: (ticked(name)[0], link) for alarm, name, link in readme_table("alarms")}
    # the table lists every store's alarms: those this one deploys, and those only the other does
    names = {a: alarm_name(template, p) for a, p in alarms(template).items()}
    others = set(template.of_type("AWS::CloudWatch::Alarm")) - set(names)
    assert {alarm: name for alarm, (name, _) in documented.items() if alarm not in others} == names
    assert others <= set(documented)
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,4} (.+)$", DOCS["operations"], re.M)
    }
    for alarm, (_, link) in documented.items():
        [anchor] = re.findall(r"\]\(#([a-z0-9-]+)\)", link)
        assert anchor in headings, f"{alarm}: no section #{anchor} in docs/operations.md"


def logged_messages(*folders: str) -> set[str]:
    """Every message a logger call under these folders is given (either branch of a conditional one)."""
    levels = {"debug", "info", "warning", "error", "exception", "critical"}
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                    continue
                if node.func.attr not in levels:
                    continue
                message = node.args[0]
                branches = [message.body, message.orelse] if isinstance(message, ast.IfExp) else [message]
                found |= {b.value for b in branches if isinstance(b, ast.Constant) and type(b.value) is str}
    return found


def test_every_message_a_runbook_query_filters_on_is_one_the_code_logs():
    # A query filtering on a message no longer logged finds nothing, and reads as "nothing went wrong".
    clauses = re.findall(r"filter message ([^`]+)`", DOCS["operations"])
    quoted = {message for clause in clauses for message in re.findall(r'"([^"]+)"', clause)}
    assert quoted, "no Logs Insights `filter message` clause found in docs/operations.md"
    assert quoted - logged_messages("layers", "functions") == set()


# --- the order database's network and password (OrderStore=postgres) -------------------------------------
def test_every_function_runs_in_the_order_database_vpc_with_postgres(template: Template):
    for name in functions(template):
        network_rights = {(a, r) for a, r in granted(template, name) if a.startswith("ec2:")}
        if store(template) == "postgres":
            # the nested stack's private subnets and the security group its database admits
            assert template.properties(name)["VpcConfig"] == {
                "SubnetIds": NETWORK["SubnetIds"].split(","),
                "SecurityGroupIds": [NETWORK["FunctionSecurityGroupId"]],
            }, name
            assert network_rights == {(action, "*") for action in NETWORK_INTERFACE_ACTIONS}, name
        else:
            assert "VpcConfig" not in template.properties(name), name
            assert network_rights == set(), name


def test_only_the_functions_that_connect_to_the_order_database_read_its_password(template: Template):
    secret_rights = {
        name: {(a, r) for a, r in granted(template, name) if a.startswith("secretsmanager:") or r == SECRET}
        for name in functions(template)
    }
    readers = {name for name, rights in secret_rights.items() if rights}
    if store(template) == "dynamodb":
        assert readers == set()
        return
    assert readers == DATABASE_CLIENTS
    for name in readers:
        assert secret_rights[name] == {("secretsmanager:GetSecretValue", SECRET)}, name
        assert template.function(name).environment["DATABASE_SECRET_ARN"] == template.resolve(
            {"Fn::GetAtt": ["OrderDatabase", "Outputs.SecretArn"]}
        ), name
    # the orders live in the database then: the orders table's rights go, for the code that had them
    for name in ("OrdersApiFunction", "OrderStatusFunction"):
        assert {(a, r) for a, r in granted(template, name) if r == "OrdersTable"} == set(), name
