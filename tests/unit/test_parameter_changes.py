"""Parameter changes do what they say on AWS: what CloudFormation does to each resource when a deployed
stack is updated with another parameter value, from the template as CloudFormation processes it (the
language extensions with the parameter values, then the SAM transform, and the nested order database's
own template: tools/template/translate.py).

For each parameter and both order stores: the resources that must act do (the relay switch reaches the
migration custom resource, the functions get the new configuration, and with SnapStart the alias `live`
moves to a version published with it), and what holds data stays: the tables, the queues, the bus and
its archive and the Aurora cluster are never replaced or removed (OrderStore=postgres→dynamodb takes the
order database out of the stack and keeps it: DeletionPolicy RetainExceptOnCreate).
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tools.template import TEMPLATE_PATH, TemplateError, load_yaml
from tools.template.comparison import REPLACEMENT, ChangeSet, compare
from tools.template.translate import Stack, translate

# The template under test: the repository's (a path), or data built from it.
TEMPLATE: Path | dict[str, Any] = TEMPLATE_PATH

POSTGRES = {"OrderStore": "postgres"}
STORES = {"dynamodb": {}, "postgres": POSTGRES}
# PostgresRelay=logical needs logical replication on, and the template's Rule then refuses an Aurora
# that may pause: the relay switches below run on a stack that has both, as docs/configuration.md's
# switch does (DatabaseLogicalReplication=on first).
LOGICAL_READY = {"DatabaseLogicalReplication": "on", "DatabaseMinCapacity": "0.5"}
SNAPSTART = {"SnapStart": "PublishedVersions"}


def template_data() -> dict[str, Any]:
    return load_yaml(TEMPLATE) if isinstance(TEMPLATE, Path) else copy.deepcopy(TEMPLATE)


@cache
def _stack(parameters: tuple[tuple[str, str], ...], template: str) -> Stack:
    return translate(dict(parameters), TEMPLATE)


def stack(parameters: dict[str, str]) -> Stack:
    return _stack(tuple(sorted(parameters.items())), json.dumps(TEMPLATE, sort_keys=True, default=str))


def change(before: dict[str, str], after: dict[str, str]) -> ChangeSet:
    return compare(stack(before), stack(after))


def of_type(translated: Stack, resource_type: str) -> set[str]:
    return {k for k, v in translated.resources.items() if v["Type"] == resource_type}


def must_stay(translated: Stack) -> set[str]:
    """What holds data or must keep its identity: the DynamoDB tables, every queue, the bus and its
    archive (the replay window) and, on the postgres store, the Aurora cluster in the nested stack."""
    kept = {"OrdersTable", "InventoryTable", "IdempotencyTable", "EventBus", "EventBusArchive"}
    kept |= of_type(translated, "AWS::SQS::Queue")
    if "OrderDatabase" in translated.nested:
        kept.add("OrderDatabase/Cluster")
    assert kept <= set(translated.all_resources()), kept - set(translated.all_resources())
    return kept


# Every change the tests below look at: (name, parameters before, parameters after), from each store.
CHANGES: list[tuple[str, dict[str, str], dict[str, str]]] = []
for _store, _base in STORES.items():
    CHANGES += [
        (f"{_store}: OutboxTtlDays 16 -> 30", _base, {**_base, "OutboxTtlDays": "30"}),
        (f"{_store}: ApiAuthType AWS_IAM -> NONE", _base, {**_base, "ApiAuthType": "NONE"}),
        (f"{_store}: ApiAuthType NONE -> AWS_IAM", {**_base, "ApiAuthType": "NONE"}, _base),
        (f"{_store}: SnapStart None -> PublishedVersions", _base, {**_base, **SNAPSTART}),
        (f"{_store}: SnapStart PublishedVersions -> None", {**_base, **SNAPSTART}, _base),
        (
            f"{_store}: DatabaseLogicalReplication auto -> on",
            _base,
            {**_base, "DatabaseLogicalReplication": "on"},
        ),
        (
            f"{_store}: PostgresRelay polling -> logical",
            {**_base, **LOGICAL_READY},
            {**_base, **LOGICAL_READY, "PostgresRelay": "logical"},
        ),
        (
            f"{_store}: PostgresRelay logical -> polling",
            {**_base, **LOGICAL_READY, "PostgresRelay": "logical"},
            {**_base, **LOGICAL_READY},
        ),
    ]
CHANGES += [
    ("dynamodb: OrderStore dynamodb -> postgres", {}, POSTGRES),
    ("postgres: OrderStore postgres -> dynamodb", POSTGRES, {}),
]


@pytest.mark.parametrize(("before", "after"), [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES])
def test_no_parameter_change_replaces_or_removes_what_holds_data(before, after):
    changes = change(before, after)
    kept = must_stay(stack(before))

    assert {k: str(changes[k]) for k in kept if changes[k].action in ("replace", "remove")} == {}
    assert changes.replaced == set(), {k: str(changes[k]) for k in changes.replaced}


# --- PostgresRelay ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), [("polling", "logical"), ("logical", "polling")])
def test_a_relay_switch_reaches_the_migration_custom_resource_with_the_new_mode(old, new):
    before = {**POSTGRES, **LOGICAL_READY, "PostgresRelay": old}
    after = {**POSTGRES, **LOGICAL_READY, "PostgresRelay": new}
    changes = change(before, after)

    # CloudFormation sends a custom resource an Update only when its properties change, and sends
    # them: the switch happens only if the resource is modified, and as the properties say.
    assert changes["OrderDatabaseSchema"].action == "modify", str(changes["OrderDatabaseSchema"])
    assert stack(after).properties("OrderDatabaseSchema").get("RelayMode") == new
    assert stack(before).properties("OrderDatabaseSchema").get("RelayMode") == old
    # The functions that read or publish the outbox by relay get the new mode...
    for function in ("OutboxPublisherFunction", "OrderStoreMaintenanceFunction"):
        assert "Environment.Variables.POSTGRES_RELAY" in changes[function].paths, function
    # ...after the switch: CloudFormation updates a resource after those it depends on.
    for function in ("OutboxPublisherFunction", "OrderStoreMaintenanceFunction"):
        assert stack(after).template["Resources"][function]["DependsOn"] == "OrderDatabaseSchema"
    alarm = "ReplicationSlotRetainedAlarm"
    assert changes[alarm].action == ("add" if new == "logical" else "remove")
    # Logical replication was on before and stays on: the database itself is not touched.
    assert changes["OrderDatabase"].action == "unchanged"
    assert changes["OrderDatabase/Cluster"].action == "unchanged"


def test_a_relay_switch_without_logical_replication_turned_on_first_changes_the_parameter_group_too():
    changes = change(POSTGRES, {**POSTGRES, "PostgresRelay": "logical"})

    assert changes["OrderDatabase"].paths == ("Parameters.LogicalReplication",)
    # A static parameter: it applies at the writer's next reboot, so the migration step then finds
    # wal_level not yet logical and fails the deploy (docs/configuration.md, switching a live stack).
    assert changes["OrderDatabase/ClusterParameterGroup"].paths == ("Parameters.rds.logical_replication",)
    assert changes["OrderDatabaseSchema"].action == "modify", str(changes["OrderDatabaseSchema"])


def test_the_relay_parameter_changes_nothing_but_the_environment_on_the_dynamodb_store():
    changes = change(LOGICAL_READY, {**LOGICAL_READY, "PostgresRelay": "logical"})

    assert "OrderDatabase" not in changes
    assert {(c.action, c.resource_type) for c in changes.acting.values()} == {
        ("modify", "AWS::Lambda::Function")
    }
    for function, found in changes.acting.items():
        assert "Environment.Variables.POSTGRES_RELAY" in found.paths, function
        assert all(p.startswith("Environment.Variables.") for p in found.paths), function


# --- DatabaseLogicalReplication ----------------------------------------------------------------------


def test_turning_logical_replication_on_changes_the_cluster_parameter_group_only():
    changes = change(POSTGRES, {**POSTGRES, "DatabaseLogicalReplication": "on"})

    assert {k: str(c) for k, c in changes.acting.items()} == {
        "OrderDatabase": "modify (Parameters.LogicalReplication)",
        "OrderDatabase/ClusterParameterGroup": "modify (Parameters.rds.logical_replication)",
    }
    # Nothing for the migration step to do: the relay stays polling (it checks the server's own
    # wal_level when it switches, the parameter group's value applying only at the next reboot).
    assert changes["OrderDatabaseSchema"].action == "unchanged"


def test_logical_replication_changes_nothing_on_the_dynamodb_store():
    assert change({}, {"DatabaseLogicalReplication": "on"}).acting == {}


# --- OrderStore -------------------------------------------------------------------------------------


def common_functions() -> set[str]:
    """The functions both stores deploy: the DynamoDB store's (OrderStore=postgres adds, removes none)."""
    return of_type(stack({}), "AWS::Lambda::Function")


def test_switching_to_postgres_adds_the_order_database_and_moves_every_function_into_its_network():
    changes = change({}, POSTGRES)

    # The stream relay's stopped alarm reads orders created against events it published: with postgres the
    # polling publisher publishes them (its pending-age alarm covers a stop).
    assert changes.removed == DYNAMODB_ONLY
    assert {"OrderDatabase", "OrderDatabase/Cluster", "OrderDatabaseSchema"} <= changes.added
    assert {"OutboxPublisherFunction", "OrderStoreMaintenanceFunction"} <= changes.added
    for function in common_functions():
        assert {"Environment.Variables.ORDER_STORE", "VpcConfig"} <= set(changes[function].paths), function
    # The orders table stays (empty from now on: the orders live in PostgreSQL).
    assert changes["OrdersTable"].action == "unchanged"


# What OrderStore=dynamodb alone creates.
DYNAMODB_ONLY = {"RelayStoppedAlarm"}


# What OrderStore=postgres alone creates, removed again by a switch back (SAM's hashed Version id of the
# migration function written with *).
POSTGRES_ONLY = {
    "OrderDatabase",
    "OrderDatabaseMigrationFunction",
    "OrderDatabaseMigrationFunctionAliaslive",
    "OrderDatabaseMigrationFunctionEventInvokeConfig",
    "OrderDatabaseMigrationFunctionRole",
    "OrderDatabaseMigrationFunctionVersion*",
    "OrderDatabaseMigrationLogGroup",
    "OrderDatabaseSchema",
    "OrderStoreMaintenanceErrorsAlarm",
    "OrderStoreMaintenanceFunction",
    "OrderStoreMaintenanceFunctionEveryMinute",
    "OrderStoreMaintenanceFunctionEveryMinuteRole",
    "OrderStoreMaintenanceFunctionEventInvokeConfig",
    "OrderStoreMaintenanceFunctionRole",
    "OrderStoreMaintenanceLogGroup",
    "OutboxPendingAgeAlarm",
    "OutboxPublisherEffectPolicy",
    "OutboxPublisherErrorsAlarm",
    "OutboxPublisherFunction",
    "OutboxPublisherFunctionEveryMinute",
    "OutboxPublisherFunctionEveryMinuteRole",
    "OutboxPublisherFunctionEventInvokeConfig",
    "OutboxPublisherFunctionRole",
    "OutboxPublisherLogGroup",
    "OutboxRowsAlarm",
}


def test_switching_back_to_dynamodb_retains_the_order_database_and_removes_only_what_serves_it():
    before = stack(POSTGRES)
    changes = change(POSTGRES, {})

    # The nested stack has DeletionPolicy RetainExceptOnCreate (its orders, and any outbox rows not yet
    # published, must not go with a parameter; only the rollback of the deploy that created it, when it
    # holds nothing yet, deletes it): CloudFormation takes it out of the stack and deletes none of it, the
    # Aurora cluster included, whatever DatabaseDeletionProtection says (docs/configuration.md: delete its
    # stack yourself). The functions and resources that only serve it are removed.
    assert before.resources["OrderDatabase"]["DeletionPolicy"] == "RetainExceptOnCreate"
    assert before.resources["OrderDatabase"]["UpdateReplacePolicy"] == "Retain"
    top = {re.sub(r"Version[0-9a-f]{10}$", "Version*", k) for k in changes.removed if "/" not in k}
    assert top == POSTGRES_ONLY - {"OrderDatabase"}
    assert changes.retained == {"OrderDatabase"} | {
        f"OrderDatabase/{k}" for k in before.nested["OrderDatabase"].resources
    }
    assert "OrderDatabase/Cluster" in changes.retained
    assert not {k for k in changes.removed if "/" in k}
    assert changes.added == DYNAMODB_ONLY
    for function in common_functions():
        assert {"Environment.Variables.ORDER_STORE", "VpcConfig"} <= set(changes[function].paths), function


@pytest.mark.parametrize("store", sorted(STORES))
def test_the_outbox_tables_outlive_the_stack_but_not_a_failed_first_deploy(store: str):
    """A deleted stack keeps the orders, the stock and every outbox event not yet published; the rollback
    of the deploy that created the tables deletes them (they hold nothing yet, and a retried first deploy
    would otherwise leave two more tables behind each time)."""
    translated = stack(STORES[store])
    tables = {"OrdersTable", "InventoryTable"}
    assert tables <= of_type(translated, "AWS::DynamoDB::Table")
    for table in tables:
        assert translated.resources[table]["DeletionPolicy"] == "RetainExceptOnCreate", table
        assert translated.resources[table]["UpdateReplacePolicy"] == "Retain", table


# --- OutboxTtlDays ----------------------------------------------------------------------------------


@pytest.mark.parametrize("store", STORES)
def test_the_outbox_ttl_reaches_every_function_and_the_archive(store):
    base = STORES[store]
    changes = change(base, {**base, "OutboxTtlDays": "30"})

    for function in of_type(stack(base), "AWS::Lambda::Function"):
        assert "Environment.Variables.OUTBOX_TTL_DAYS" in changes[function].paths, function
    assert changes["EventBusArchive"].paths == ("RetentionDays",)
    assert stack({**base, "OutboxTtlDays": "30"}).properties("EventBusArchive")["RetentionDays"] == 30


# --- ApiAuthType ------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize(("old", "new"), [("AWS_IAM", "NONE"), ("NONE", "AWS_IAM")])
def test_the_api_authorization_reaches_the_stage_through_a_new_deployment(store, old, new):
    base = STORES[store]
    before, after = {**base, "ApiAuthType": old}, {**base, "ApiAuthType": new}
    changes = change(before, after)

    assert "Body.securityDefinitions" in changes["OrdersApi"].paths
    # API Gateway serves a stage's deployment, a snapshot of the API: the stage must move to a new one.
    deployments = of_type(stack(after), "AWS::ApiGateway::Deployment")
    assert len(deployments) == 1
    assert deployments == changes.of("add")
    assert changes.removed == of_type(stack(before), "AWS::ApiGateway::Deployment")
    assert changes["OrdersApidevStage"].paths == ("DeploymentId",)
    assert not {k for k, c in changes.acting.items() if c.resource_type == "AWS::Lambda::Function"}


# --- SnapStart --------------------------------------------------------------------------------------


def aliases(translated: Stack) -> dict[str, str]:
    """function → the Version its alias `live` points at."""
    found = {}
    for logical_id in of_type(translated, "AWS::Lambda::Alias"):
        properties = translated.resources[logical_id]["Properties"]
        found[properties["FunctionName"]["Ref"]] = properties["FunctionVersion"]["Fn::GetAtt"][0]
    return found


@pytest.mark.parametrize("store", STORES)
def test_snapstart_on_puts_every_function_behind_a_published_version_and_off_takes_it_away(store):
    base = STORES[store]
    on = change(base, {**base, **SNAPSTART})
    off = change({**base, **SNAPSTART}, base)
    functions = of_type(stack(base), "AWS::Lambda::Function")
    before = aliases(stack(base))  # the migration function has its alias whatever SnapStart says

    for function in functions:
        for found in (on[function], off[function]):
            assert "SnapStart.ApplyOn" in found.paths, function
            assert all(p == "SnapStart.ApplyOn" or p.startswith("Environment.") for p in found.paths)
    added = {f: v for f, v in aliases(stack({**base, **SNAPSTART})).items() if f not in before}
    assert set(added) == functions - set(before)
    assert set(added.values()) <= on.added
    assert set(added.values()) <= off.removed
    # A function that had its alias already publishes a version with the new setting.
    assert stale_aliases(on, stack({**base, **SNAPSTART})) == {}
    assert stale_aliases(off, stack(base)) == {}
    # Whatever invokes a function invokes the alias from then on: mappings, the API's permissions.
    for invoker in of_type(stack(base), "AWS::Lambda::EventSourceMapping") | of_type(
        stack(base), "AWS::Lambda::Permission"
    ):
        assert on[invoker].paths == ("FunctionName",), invoker
        assert off[invoker].paths == ("FunctionName",), invoker


def stale_aliases(changes: ChangeSet, after: Stack) -> dict[str, tuple[str, ...]]:
    """Functions whose configuration changes while their alias `live` keeps its Version: a published
    version is immutable, so whatever the alias serves keeps the old configuration."""
    return {
        function: changes[function].paths
        for function, version in aliases(after).items()
        if changes.get(function) is not None
        and changes[function].action == "modify"
        and changes[version].action != "add"
    }


def globals_parameters() -> set[str]:
    """The parameters the functions' Globals follow, directly or through a condition."""
    data = template_data()
    conditions = data.get("Conditions") or {}

    def named(value: Any) -> set[str]:
        found: set[str] = set()
        if isinstance(value, list):
            for item in value:
                found |= named(item)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key == "Ref" and isinstance(item, str):
                    found.add(item)
                elif key in ("Condition", "Fn::If"):
                    condition = item if isinstance(item, str) else item[0]
                    found |= named(conditions[condition]) | named(item if isinstance(item, str) else item[1:])
                elif key == "Fn::Sub":
                    text = item if isinstance(item, str) else item[0]
                    found |= {m.split(".")[0] for m in re.findall(r"\$\{([^!}][^}]*)\}", text)}
                    found |= named(item)
                else:
                    found |= named(item)
        return found

    return named(data["Globals"]["Function"]) & set(data["Parameters"])


# Another allowed value of each parameter the functions' Globals follow (SnapStart: the tests above).
OTHER_VALUE = {
    "Stage": "qa",
    "LogLevel": "DEBUG",
    "MetricsNamespace": "Shop",
    "OutboxTtlDays": "30",
    "MaxEventBytes": "131072",
    "OrderStore": "dynamodb",  # from postgres: the functions of both stores change their network
    "PostgresRelay": "logical",
}


def test_every_parameter_the_functions_follow_is_checked_below():
    assert globals_parameters() - {"SnapStart"} == set(OTHER_VALUE)


@pytest.mark.parametrize("snap_start", [SNAPSTART, {}], ids=["SnapStart", "no SnapStart"])
@pytest.mark.parametrize("parameter", sorted(OTHER_VALUE))
def test_a_parameter_change_publishes_a_new_version_of_every_function_it_reconfigures(parameter, snap_start):
    # The postgres store with logical replication on has every function; with SnapStart every one is
    # invoked through its alias, without it the migration function still is (its custom resource).
    before = {**POSTGRES, **LOGICAL_READY, **snap_start}
    after = {**before, parameter: OTHER_VALUE[parameter]}
    changes = change(before, after)

    reconfigured = {k for k in aliases(stack(after)) if changes.get(k) and changes[k].action == "modify"}
    assert reconfigured or parameter == "OrderStore", "the parameter changes no function"
    assert stale_aliases(changes, stack(after)) == {}


@pytest.mark.parametrize("store", STORES)
def test_the_relays_publish_concurrency_reconfigures_the_relays_and_nothing_else(store):
    """RelayPublishConcurrency is in the relays' own environment (not Globals): a change reaches their
    published versions, and no other function's."""
    before = {**STORES[store], **SNAPSTART}
    after = {**before, "RelayPublishConcurrency": "4"}
    changes = change(before, after)

    reconfigured = {k for k in aliases(stack(after)) if changes.get(k) and changes[k].action == "modify"}
    # The stream relay serves the inventory table's outbox on both stores; the publisher, the database's.
    relays = (
        {"OutboxRelayFunction", "OutboxPublisherFunction"} if store == "postgres" else {"OutboxRelayFunction"}
    )
    assert reconfigured == relays
    assert stale_aliases(changes, stack(after)) == {}


@pytest.mark.parametrize("snap_start", [SNAPSTART, {}], ids=["SnapStart", "no SnapStart"])
def test_the_publishers_memory_size_reconfigures_the_publisher_and_nothing_else(snap_start):
    """PublisherMemorySize is the publisher's own MemorySize: a change modifies that function alone, in
    place (its log group, schedule and role stay), and reaches its published version behind `live`."""
    before = {**POSTGRES, **snap_start}
    after = {**before, "PublisherMemorySize": "1769"}
    changes = change(before, after)

    assert changes["OutboxPublisherFunction"].action == "modify", str(changes["OutboxPublisherFunction"])
    assert changes["OutboxPublisherFunction"].paths == ("MemorySize",)
    # Nothing else acts but the publisher's new version and its alias (with SnapStart).
    assert {k for k in changes.acting if not k.startswith("OutboxPublisherFunction")} == set()
    assert stack(after).template["Resources"]["OutboxPublisherFunction"]["Properties"]["MemorySize"] == 1769
    assert stale_aliases(changes, stack(after)) == {}


def test_a_new_shared_layer_publishes_a_new_version_of_every_function_and_reruns_the_migrations():
    """The layer holds the domain code and the schema's migrations: a deploy that changes only it (a
    new migration) must reach the published versions and run the migration custom resource again."""
    data = template_data()
    changed = copy.deepcopy(data)
    changed["Resources"]["SharedLayer"]["Properties"]["ContentUri"] = "layers/shared-changed/"
    for snap_start in ({}, SNAPSTART):
        parameters = {**POSTGRES, **snap_start}
        changes = compare(translate(parameters, data), translate(parameters, changed))
        after = translate(parameters, changed)

        assert aliases(after)
        assert stale_aliases(changes, after) == {}
        assert changes["OrderDatabaseSchema"].action == "modify", str(changes["OrderDatabaseSchema"])


# --- what the translation is held to ---------------------------------------------------------------


def test_cloudformation_refuses_logical_replication_on_a_cluster_that_may_pause():
    with pytest.raises(TemplateError, match="DatabaseMinCapacity above 0"):
        translate({**POSTGRES, "PostgresRelay": "logical", "DatabaseMinCapacity": "0"}, TEMPLATE)


def test_what_the_language_extensions_cannot_resolve_stays_an_intrinsic():
    translated = stack({})
    # A partial Fn::Sub keeps its resource placeholders (and Fn::Sub), its parameters substituted.
    assert translated.template["Outputs"]["ApiUrl"]["Value"] == {
        "Fn::Sub": "https://${OrdersApi}.execute-api.us-east-1.amazonaws.com/dev"
    }
    body = translated.template["Resources"]["OperationsDashboard"]["Properties"]["DashboardBody"]
    [text, variables] = body["Fn::Sub"]  # the store's alarms: a variable naming a resource, kept too
    assert "${RelayIteratorAgeAlarm.Arn}" in text
    assert variables == {"OrderStoreAlarms": {"Fn::Sub": ', "${RelayStoppedAlarm.Arn}"'}}


def test_the_replacement_table_is_what_the_resource_schemas_say():
    """The reference pages' "Update requires: Replacement" is the registry schemas' createOnlyProperties
    (conditionalCreateOnlyProperties: "Replacement" in some cases), which cfn-lint bundles."""
    schemas = resources.files("cfnlint.data.schemas")
    providers = json.loads(schemas.joinpath("providers", "us-east-1.json").read_text())
    for resource_type, properties in REPLACEMENT.items():
        schema = json.loads(schemas.joinpath("resources", f"{providers[resource_type]}.json").read_text())
        create_only = {p.removeprefix("/properties/") for p in schema.get("createOnlyProperties", [])}
        conditional = {
            p.removeprefix("/properties/") for p in schema.get("conditionalCreateOnlyProperties", [])
        }
        assert create_only <= properties <= create_only | conditional, resource_type
