"""What IAM authorises for one AWS API call: its action(s), the ARN of each resource it touches, and the
condition keys the call itself sets.

`touches(service, operation, params, names)` takes a call as botocore makes it (the client's signing
name, e.g. "dynamodb"; the operation, e.g. "TransactWriteItems"; its parameters) and returns one
`Touch` per authorisation AWS makes, following the Service Authorization Reference:

- a DynamoDB transaction is authorised item by item (Put → dynamodb:PutItem, ...), a batch per table;
  a Query or Scan on an index on the index's ARN (table/<name>/index/<index>); a call on one item
  carries its partition key's value as dynamodb:LeadingKeys, for the tables whose partition key
  attribute `names` knows;
- SQS names a queue by URL, the ARN is arn:aws:sqs:<region>:<account>:<name>; a *Batch action is
  authorised as its single action (SendMessageBatch → sqs:SendMessage);
- EventBridge PutEvents on each entry's bus (the default bus when it names none), with the
  entry's events:source and events:detail-type;
- actions without resource-level permissions (X-Ray, dynamodb:ListStreams, ...) on "*".

A call names resources the way the code was configured (a table's name, a queue's URL, a placeholder
of the local stack); `names` maps those to ARNs where AWS's naming rules cannot (a secret's name has a
random suffix), and anything else follows those rules in `region` and `account`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tools.template import ACCOUNT, REGION

ContextValue = str | tuple[str, ...]

_TRANSACT_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}
# Calls on one item, named by its Key (PutItem: its Item).
_ITEM_OPERATIONS = {"GetItem", "PutItem", "UpdateItem", "DeleteItem"}
# Batch operations IAM authorises as their single action (no action of their own).
_BATCH_ACTIONS = {
    "sqs": {
        "SendMessageBatch": "SendMessage",
        "DeleteMessageBatch": "DeleteMessage",
        "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
    },
    "sns": {"PublishBatch": "Publish"},
}
# Actions with no resource-level permissions: IAM evaluates them on "*".
WILDCARD_ONLY = {
    "dynamodb:ListStreams",
    "dynamodb:ListTables",
    "sqs:ListQueues",
    "sns:ListTopics",
    "secretsmanager:ListSecrets",
    "secretsmanager:GetRandomPassword",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "cloudwatch:PutMetricData",
}
# Calls IAM does not authorise at all.
UNAUTHORISED = {"sts:GetCallerIdentity"}


class UnknownResource(ValueError):
    """A call names a resource this module cannot turn into an ARN."""


@dataclass(frozen=True)
class Touch:
    """One authorisation a call needs: an action on a resource ARN ("*" for none), in a context."""

    action: str
    resource: str
    context: tuple[tuple[str, ContextValue], ...] = ()


def queue_arn(url: str) -> str:
    """An SQS queue's ARN from its URL (https://sqs.<region>.amazonaws.com/<account>/<name>)."""
    scheme, _, rest = url.partition("://")
    host, _, path = rest.partition("/")
    account, _, name = path.partition("/")
    if not scheme or not account.isdigit() or not name or "/" in name:
        raise UnknownResource(f"not a queue URL: {url!r}")
    labels = host.split(".")
    region = labels[1] if labels[0] == "sqs" else labels[0] if labels[1:2] == ["queue"] else REGION
    return f"arn:aws:sqs:{region}:{account}:{name}"


class ResourceNames:
    """ARNs for the names a call gives, by AWS's naming rules and the `names` it was given; and the
    partition key attribute of the tables in `partition_keys` (table ARN → attribute name)."""

    def __init__(
        self,
        names: Mapping[str, str] | None = None,
        region: str = REGION,
        account: str = ACCOUNT,
        partition_keys: Mapping[str, str] | None = None,
    ):
        self.names = dict(names or {})
        self.region = region
        self.account = account
        self.partition_keys = dict(partition_keys or {})

    def _known(self, value: str, service: str) -> str | None:
        arn = self.names.get(value)
        if arn is not None:
            return arn
        if value.startswith(f"arn:aws:{service}:"):
            return value
        return None

    def table(self, name: str) -> str:
        return self._known(name, "dynamodb") or f"arn:aws:dynamodb:{self.region}:{self.account}:table/{name}"

    def _required(self, arn: str, service: str, what: str) -> str:
        known = self._known(arn, service)
        if known is None:
            raise UnknownResource(f"not a {what} ARN: {arn!r}")
        return known

    def stream(self, arn: str) -> str:
        return self._required(arn, "dynamodb", "stream")

    def queue(self, url: str) -> str:
        return self._known(url, "sqs") or queue_arn(url)

    def queue_named(self, name: str) -> str:
        return self._known(name, "sqs") or f"arn:aws:sqs:{self.region}:{self.account}:{name}"

    def topic(self, arn: str) -> str:
        return self._required(arn, "sns", "topic")

    def bus(self, name: str | None) -> str:
        name = name or "default"
        return self._known(name, "events") or (
            f"arn:aws:events:{self.region}:{self.account}:event-bus/{name}"
        )

    def secret(self, secret_id: str) -> str:
        known = self._known(secret_id, "secretsmanager")
        if known is None:  # a name: its ARN ends with 6 random characters only AWS knows
            raise UnknownResource(f"secret {secret_id!r}: name it by its ARN, or give its ARN in names")
        return known

    def function(self, name: str) -> str:
        return self._known(name, "lambda") or (f"arn:aws:lambda:{self.region}:{self.account}:function:{name}")


def _item(action: str, table: str, key: Mapping[str, Any] | None, names: ResourceNames) -> Touch:
    """An action on one item: with its partition key's value as dynamodb:LeadingKeys when the table's
    partition key attribute is known (a value as the call gives it: {"S": "..."}, {"N": "..."})."""
    attribute = names.partition_keys.get(table)
    if attribute is None or key is None or attribute not in key:
        return Touch(action, table)
    [value] = key[attribute].values()
    return Touch(action, table, (("dynamodb:LeadingKeys", (str(value),)),))


def _dynamodb(operation: str, params: Mapping[str, Any], names: ResourceNames) -> list[Touch]:
    if operation in {"TransactWriteItems", "TransactGetItems"}:  # authorised item by item
        touches = []
        for item in params["TransactItems"]:
            [(kind, spec)] = item.items()
            action, table = f"dynamodb:{_TRANSACT_ACTIONS[kind]}", names.table(spec["TableName"])
            touches.append(_item(action, table, spec.get("Key") or spec.get("Item"), names))
        return touches
    if operation in {"BatchGetItem", "BatchWriteItem"}:
        return [Touch(f"dynamodb:{operation}", names.table(table)) for table in params["RequestItems"]]
    if "StreamArn" in params:
        return [Touch(f"dynamodb:{operation}", names.stream(params["StreamArn"]))]
    if "TableName" in params:
        table = names.table(params["TableName"])
        if operation in {"Query", "Scan"} and params.get("IndexName"):
            table = f"{table}/index/{params['IndexName']}"
        if operation in _ITEM_OPERATIONS:
            return [_item(f"dynamodb:{operation}", table, params.get("Key") or params.get("Item"), names)]
        return [Touch(f"dynamodb:{operation}", table)]
    return [Touch(f"dynamodb:{operation}", "*")]


def _events(operation: str, params: Mapping[str, Any], names: ResourceNames) -> list[Touch]:
    if operation != "PutEvents":
        resource = names.bus(params.get("EventBusName")) if "EventBusName" in params else "*"
        return [Touch(f"events:{operation}", resource)]
    return [
        Touch(
            "events:PutEvents",
            names.bus(entry.get("EventBusName")),
            (("events:detail-type", entry["DetailType"]), ("events:source", entry["Source"])),
        )
        for entry in params["Entries"]
    ]


def touches(
    service: str, operation: str, params: Mapping[str, Any], names: ResourceNames | None = None
) -> list[Touch]:
    """The authorisations one call needs (module docstring), without repeats, in the call's order."""
    names = names or ResourceNames()
    action = f"{service}:{_BATCH_ACTIONS.get(service, {}).get(operation, operation)}"
    found: list[Touch]
    if action in UNAUTHORISED:
        found = []
    elif action in WILDCARD_ONLY:
        found = [Touch(action, "*")]
    elif service == "dynamodb":
        found = _dynamodb(operation, params, names)
    elif service == "events":
        found = _events(operation, params, names)
    elif service == "sqs" and "QueueUrl" in params:
        found = [Touch(action, names.queue(params["QueueUrl"]))]
    elif service == "sqs" and "QueueName" in params:
        found = [Touch(action, names.queue_named(params["QueueName"]))]
    elif service == "sns" and ("TopicArn" in params or "TargetArn" in params):
        found = [Touch(action, names.topic(params.get("TopicArn") or params["TargetArn"]))]
    elif service == "secretsmanager" and "SecretId" in params:
        found = [Touch(action, names.secret(params["SecretId"]))]
    elif service == "lambda" and "FunctionName" in params:
        found = [Touch(action, names.function(params["FunctionName"]))]
    else:
        raise UnknownResource(
            f"{service}:{operation}: which resource it touches is not known here (tools/iam/calls.py)"
        )
    return list(dict.fromkeys(found))
