"""Which of the template's tables a function's role may write, read from its IAM statements.

The stream pollers use it to read a table's stream right after an invocation of a function that may
have written the table (other invocations cannot have, so a read after them finds nothing). IAM is not
enforced locally, so this is a hint for when to read, never a rule: a mapping still polls its shard 4
times a second, as Lambda does. Whatever cannot be read here for certain (a role or managed policy from
outside the template, NotAction, NotResource) counts as "may write every table".

A function's role is its Role (an AWS::IAM::Role of the template: its inline Policies, its
ManagedPolicyArns and the AWS::IAM::RolePolicy / Policy / ManagedPolicy resources naming it) or, without
Role, the one SAM generates from its Policies (policy templates arrive expanded by SAM's plugins);
AWS::Serverless::Connector resources whose source is the function add to either.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from tools.template import Template

# IAM actions that write items (TransactWriteItems is authorised as the Put/Update/Delete it contains,
# and is listed for policies that name it anyway).
TABLE_WRITE_ACTIONS = (
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:TransactWriteItems",
    "dynamodb:PartiQLInsert",
    "dynamodb:PartiQLUpdate",
    "dynamodb:PartiQLDelete",
)
# AWS managed policies that grant no item writes (SAM attaches the first to every role it generates).
_MANAGED_WITHOUT_TABLE_WRITES = frozenset(
    {
        "AWSLambdaBasicExecutionRole",
        "AWSLambdaDynamoDBExecutionRole",
        "AWSLambdaSQSQueueExecutionRole",
        "AWSLambdaVPCAccessExecutionRole",
        "AWSXRayDaemonWriteAccess",
        "AWSXrayWriteOnlyAccess",
    }
)
_ROLE_POLICY_TYPES = {
    "AWS::IAM::RolePolicy": "RoleName",
    "AWS::IAM::Policy": "Roles",
    "AWS::IAM::ManagedPolicy": "Roles",
}


class _Unknown(Exception):
    """A grant whose effect on the tables cannot be told here."""


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _writes(action: Any) -> bool:
    # IAM matches actions case-insensitively, with * and ? wildcards.
    pattern = str(action).lower()
    return any(fnmatchcase(write.lower(), pattern) for write in TABLE_WRITE_ACTIONS)


class _Grants:
    def __init__(self, template: Template) -> None:
        self._template = template
        self._tables = {
            logical_id: template.arn(logical_id)
            for logical_id in template.of_type("AWS::DynamoDB::Table")
            if template.is_created(logical_id)
        }

    def tables_in(self, document: Any) -> set[str]:
        """The tables an IAM policy document (or a SAM Policies entry with Statement) lets write."""
        if not isinstance(document, dict):
            raise _Unknown
        written: set[str] = set()
        for statement in _as_list(document.get("Statement", [])):
            if not isinstance(statement, dict) or statement.get("Effect") != "Allow":
                continue  # a Deny only takes away: ignoring it errs towards reading more often
            if "NotAction" in statement or "NotResource" in statement:
                raise _Unknown
            if not any(_writes(action) for action in _as_list(statement.get("Action", []))):
                continue
            for resource in _as_list(statement.get("Resource", [])):
                if not isinstance(resource, str):
                    raise _Unknown
                written |= {table for table, arn in self._tables.items() if fnmatchcase(arn, resource)}
        return written

    def managed(self, policy: Any) -> set[str]:
        """A managed policy by name or ARN: one of the template's, or an AWS managed policy."""
        for logical_id in self._template.of_type("AWS::IAM::ManagedPolicy"):
            if policy in {self._template.physical_name(logical_id), self._template.arn(logical_id)}:
                return self.tables_in(self._template.properties(logical_id).get("PolicyDocument"))
        if str(policy).rsplit("/", 1)[-1] in _MANAGED_WITHOUT_TABLE_WRITES:
            return set()
        raise _Unknown

    def role(self, role_arn: Any) -> set[str]:
        role = self._template.logical_id_for_arn(str(role_arn))
        if role is None or self._template.resources[role]["Type"] != "AWS::IAM::Role":
            raise _Unknown  # a role from outside the template
        props = self._template.properties(role)
        written: set[str] = set()
        for policy in props.get("Policies", []) or []:
            written |= self.tables_in(policy.get("PolicyDocument") if isinstance(policy, dict) else None)
        for policy in props.get("ManagedPolicyArns", []) or []:
            written |= self.managed(policy)
        name = self._template.physical_name(role)
        for kind, key in _ROLE_POLICY_TYPES.items():
            for logical_id in self._template.of_type(kind):
                if not self._template.is_created(logical_id):
                    continue
                attached = self._template.properties(logical_id)
                if name in _as_list(attached.get(key, [])):
                    written |= self.tables_in(attached.get("PolicyDocument"))
        return written

    def sam_policies(self, policies: Any) -> set[str]:
        written: set[str] = set()
        for policy in _as_list(policies or []):
            written |= self.managed(policy) if isinstance(policy, str) else self.tables_in(policy)
        return written

    def connectors(self, function: str) -> set[str]:
        """AWS::Serverless::Connector from the function (or from a source named by ARN) with Write."""
        written: set[str] = set()
        for logical_id in self._template.of_type("AWS::Serverless::Connector"):
            props = self._template.resources[logical_id].get("Properties", {})
            source = props.get("Source", {})
            if source.get("Id", function) != function or "Write" not in props.get("Permissions", []):
                continue
            destination = props.get("Destination", {}).get("Id")
            if destination not in self._tables:
                raise _Unknown
            written.add(destination)
        if self._template.resources[function].get("Properties", {}).get("Connectors"):
            raise _Unknown  # embedded connectors: not read here
        return written


def tables_written(template: Template, function: str) -> frozenset[str] | None:
    """The logical ids of the tables the function's role may write; None when that cannot be told."""
    grants = _Grants(template)
    props = template.properties(function)
    try:
        role_arn = props.get("Role")
        written = grants.sam_policies(props.get("Policies")) if role_arn is None else grants.role(role_arn)
        written |= grants.connectors(function)
    except _Unknown:
        return None
    return frozenset(written)
