"""What a CloudFormation update does to each resource: the change set of two translations.

`changes(before, after)` compares two translations (translate.py) resource by resource, on resolved
properties (Refs to parameters and pseudo parameters, conditions, Fn::If, Fn::Sub, Fn::Join, Fn::Select,
Fn::Split and Fn::FindInMap resolved; references to other resources kept as they are written:
CloudFormation resolves them to the same physical id unless that resource is replaced). A resource that
references a replaced resource, or a nested stack output whose value changes, is updated too (and
replaced if the reference is in a property whose update requires replacement). A changed logical id
(SAM's hashed Version and Deployment ids) is an add and a remove.

"replace" is reported only for the resource types of `REPLACEMENT`, from CloudFormation's resource
reference pages; a changed property of any other type is a "modify" whatever CloudFormation would do.

`python -m tools.template.change_set` (change_set.py) prints it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tools.template.intrinsics import PLACEHOLDER, cfn_string, is_intrinsic
from tools.template.reader import TEMPLATE_PATH
from tools.template.translate import Stack, translate

# Properties whose change makes CloudFormation replace the resource: "Update requires: Replacement" on
# each type's page of the CloudFormation template reference (the createOnlyProperties of its registry
# schema, which cfn-lint bundles: tests/unit/test_parameter_changes.py holds this table to it). A
# property the page marks "Replacement" only in some cases (conditionalCreateOnlyProperties) counts as
# replacement here: the question is whether a change can cost the data.
REPLACEMENT: dict[str, frozenset[str]] = {
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-dynamodb-table.html
    # (KeySchema: conditional)
    "AWS::DynamoDB::Table": frozenset({"TableName", "ImportSourceSpecification", "KeySchema"}),
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-sqs-queue.html
    "AWS::SQS::Queue": frozenset({"FifoQueue", "QueueName"}),
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-rds-dbcluster.html
    # (AvailabilityZones, Engine, GlobalClusterIdentifier, MasterUsername: conditional)
    "AWS::RDS::DBCluster": frozenset(
        {
            "ClusterScalabilityType",
            "DBClusterIdentifier",
            "DBSubnetGroupName",
            "DBSystemId",
            "DatabaseName",
            "EngineMode",
            "KmsKeyId",
            "PubliclyAccessible",
            "RestoreToTime",
            "RestoreType",
            "SnapshotIdentifier",
            "SourceDBClusterIdentifier",
            "SourceDbClusterResourceId",
            "SourceRegion",
            "StorageEncrypted",
            "UseLatestRestorableTime",
            "AvailabilityZones",
            "Engine",
            "GlobalClusterIdentifier",
            "MasterUsername",
        }
    ),
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-lambda-version.html
    # (every property; a new logical id, as SAM gives a new Version, is an add and a remove)
    "AWS::Lambda::Version": frozenset(
        {"FunctionName", "Description", "CodeSha256", "ProvisionedConcurrencyConfig", "RuntimePolicy"}
    ),
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-events-eventbus.html
    "AWS::Events::EventBus": frozenset({"Name"}),
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-events-archive.html
    # (the archive holds the events a replay republishes: OutboxTtlDays of them)
    "AWS::Events::Archive": frozenset({"ArchiveName", "SourceArn"}),
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-logs-loggroup.html
    "AWS::Logs::LogGroup": frozenset({"LogGroupName"}),
    # https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-cloudformation-stack.html
    # (no property requires replacement: the nested stack is updated, its resources compared in it)
    "AWS::CloudFormation::Stack": frozenset(),
}

# "retain": gone from the template, kept in the account (DeletionPolicy Retain, or RetainExceptOnCreate on
# a resource an update finds already created, on it or on the nested stack holding it): CloudFormation
# removes it from the stack and deletes nothing.
Action = Literal["add", "remove", "retain", "modify", "replace", "unchanged"]
_KEPT_ON_DELETE = frozenset({"Retain", "RetainExceptOnCreate"})


@dataclass(frozen=True)
class Change:
    action: Action
    resource_type: str
    paths: tuple[str, ...] = ()  # the properties that change ("Environment.Variables.X", "Policies[0]")

    def __str__(self) -> str:
        return self.action + (f" ({', '.join(self.paths)})" if self.paths else "")


class ChangeSet(dict[str, Change]):
    """Every logical id of both stacks (a nested stack's resources as "<App>/<LogicalId>") → its change."""

    def of(self, *actions: Action) -> set[str]:
        return {logical_id for logical_id, change in self.items() if change.action in actions}

    @property
    def added(self) -> set[str]:
        return self.of("add")

    @property
    def removed(self) -> set[str]:
        return self.of("remove")

    @property
    def retained(self) -> set[str]:
        return self.of("retain")

    @property
    def replaced(self) -> set[str]:
        return self.of("replace")

    @property
    def acting(self) -> dict[str, Change]:
        """The resources CloudFormation acts on."""
        return {k: v for k, v in self.items() if v.action != "unchanged"}

    def table(self) -> str:
        return "\n".join(f"{logical_id}: {change}" for logical_id, change in sorted(self.acting.items()))


def _normal(value: Any) -> Any:
    """Scalars as CloudFormation hands them to a resource provider: strings."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value if value is None else cfn_string(value)


def _differences(before: Any, after: Any, path: str = "") -> Iterator[str]:
    if isinstance(before, dict) and isinstance(after, dict) and not is_intrinsic(before):
        for key in sorted(set(before) | set(after), key=str):
            child = f"{path}.{key}" if path else str(key)
            if key not in before or key not in after:
                yield child
            else:
                yield from _differences(before[key], after[key], child)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (b, a) in enumerate(zip(before, after, strict=True)):
            yield from _differences(b, a, f"{path}[{index}]")
    elif before != after:
        yield path


def _references(value: Any, path: str = "") -> Iterator[tuple[str, str, str]]:
    """(path, logical id, attribute or "") of every reference to a resource in a resolved value."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _references(item, f"{path}[{index}]")
        return
    if not isinstance(value, dict):
        return
    if set(value) == {"Ref"} and isinstance(value["Ref"], str):
        yield path, value["Ref"], ""
        return
    if set(value) == {"Fn::GetAtt"} and isinstance(value["Fn::GetAtt"], list):
        target, *attributes = value["Fn::GetAtt"]
        yield path, str(target), ".".join(str(a) for a in attributes)
        return
    if set(value) == {"Fn::Sub"}:
        args = value["Fn::Sub"]
        text, variables = (args, {}) if isinstance(args, str) else (args[0], args[1])
        for match in PLACEHOLDER.finditer(text):
            name = match.group(1)
            if not name.startswith("!") and name not in variables:
                resource, _, attribute = name.partition(".")
                yield path, resource, attribute
        yield from _references(variables, path)
        return
    for key, item in value.items():
        yield from _references(item, f"{path}.{key}" if path else str(key))


def _replaces(resource_type: str, path: str) -> bool:
    properties = REPLACEMENT.get(resource_type)
    if properties is None:
        return False
    if resource_type == "AWS::Lambda::Version":
        return True
    top = re.split(r"[.\[]", path, maxsplit=1)[0]
    return top in properties


def compare(before: Stack, after: Stack) -> ChangeSet:
    """What CloudFormation does to each resource when `before` is updated to `after`."""
    old, new = before.all_resources(), after.all_resources()
    changes = ChangeSet()
    paths: dict[str, set[str]] = {}  # of the resources both stacks have: the properties that change
    types: dict[str, str] = {}
    for key in old.keys() | new.keys():
        if key not in new:
            stack, logical_id = old[key]
            kept = any(
                key == holder or key.startswith(holder + "/")
                for holder, (owner, holder_id) in old.items()
                if holder not in new and owner.resources[holder_id].get("DeletionPolicy") in _KEPT_ON_DELETE
            )
            changes[key] = Change("retain" if kept else "remove", stack.resources[logical_id]["Type"])
            continue
        stack, logical_id = new[key]
        types[key] = stack.resources[logical_id]["Type"]
        prior = old.get(key)
        if prior is None:
            changes[key] = Change("add", types[key])
        elif prior[0].resources[prior[1]]["Type"] != types[key]:
            changes[key] = Change("replace", types[key], ("Type",))
        else:
            paths[key] = set(
                _differences(_normal(prior[0].properties(prior[1])), _normal(stack.properties(logical_id)))
            )
    # A replaced resource gets a new physical id, and a nested stack output may change: whatever
    # references them is updated too (and replaced if the reference is in a replacing property).
    references = {key: list(_references(new[key][0].properties(new[key][1]))) for key in paths}
    outputs: dict[str, tuple[set[str], dict[str, list[str]]]] = {}  # nested stack → (changed, references)
    for key in paths:
        (stack_now, id_now), (stack_was, id_was) = new[key], old[key]
        if id_now in stack_now.nested and id_was in stack_was.nested:
            was, now = stack_was.nested[id_was].outputs(), stack_now.nested[id_now].outputs()
            differ = {n for n in was.keys() | now.keys() if _normal(was.get(n)) != _normal(now.get(n))}
            named = {n: [target for _, target, _ in _references(value)] for n, value in now.items()}
            outputs[key] = (differ, named)
    while True:
        replaced = {key for key, change in changes.items() if change.action == "replace"} | {
            key for key, found in paths.items() if any(_replaces(types[key], p) for p in found)
        }
        changed_outputs = {
            key: differ
            | {n for n, targets in named.items() if any(f"{key}/{t}" in replaced for t in targets)}
            for key, (differ, named) in outputs.items()
        }
        grew = False
        for key, referencing in references.items():
            prefix = key.rpartition("/")[0]
            for path, target, attribute in referencing:
                target_key = f"{prefix}/{target}" if prefix else target
                hit = target_key in replaced or attribute.removeprefix("Outputs.") in changed_outputs.get(
                    target_key, ()
                )
                if hit and path not in paths[key]:
                    paths[key].add(path)
                    grew = True
        if not grew:
            break
    for key, found in paths.items():
        if not found:
            changes[key] = Change("unchanged", types[key])
        else:
            action: Action = "replace" if any(_replaces(types[key], p) for p in found) else "modify"
            changes[key] = Change(action, types[key], tuple(sorted(found)))
    return changes


def changes(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    template: Path | Mapping[str, Any] = TEMPLATE_PATH,
) -> ChangeSet:
    """What CloudFormation does to each resource when a stack deployed with the parameters `before` is
    updated to `after` (parameters not given keep their defaults)."""
    return compare(translate(before, template), translate(after, template))
