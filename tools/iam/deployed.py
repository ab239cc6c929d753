"""The template as CloudFormation deploys it, with AWS's ARNs: what IAM evaluates requests against.

`deployed(template)` takes the template's data through the transforms CloudFormation runs
(tools/template/translate.py: AWS::LanguageExtensions with the parameter values, then SAM's
AWS::Serverless-2016-10-31 with the code packaged and no managed policy), so what SAM generates is
there: event source mappings, the API's Lambda permissions, the EventBridge Scheduler schedules and their
roles. The result is read by `Template`'s own resolver, with each resource's ARN and Ref in AWS's
format (`DeployedTemplate`): roles, rules, log groups, keys, aliases and schedules as IAM sees them, not
the reader's local placeholders, so the policies' Resource and Condition values are the ARNs AWS would
compare.

`role_policies` and `resource_policies` collect what AWS evaluates: every policy attached to a role
(inline, AWS::IAM::RolePolicy, AWS::IAM::Policy) and each resource's own policy (queue and topic
policies, key policies, DynamoDB table and stream policies, Lambda permissions, role trust policies).
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from tools.iam.calls import queue_arn
from tools.template import ACCOUNT, REGION, Template, chosen
from tools.template.translate import translate as cloudformation

Policy = dict[str, Any]
# What a nested stack's outputs are when the reader's placeholder is no ARN: the secret RDS manages for
# the order database's cluster (named rds!cluster-<cluster id>, with the 6 characters Secrets Manager adds).
NESTED_ARNS = {"SecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:rds!cluster-0a1b2c3d-AbCdEf"}

_SUBSTITUTION = re.compile(r"\$\{([^}]*)\}")


class DeploymentError(ValueError):
    """The template attaches what this evaluation cannot see (a managed policy, a permissions boundary)."""


def _substituted(value: Any) -> Any:
    """Each Fn::Sub with a variable map as the Fn::Join of its pieces: the same string once resolved.

    SAM CLI's resolver (1.170) finds only variables of letters, digits and one dot, and resolves a
    variable's value as a logical id, so `${__ApiId__}` in the Lambda permissions SAM generates for an
    API stayed unresolved. The pieces between variables stay Fn::Sub strings (pseudo parameters and
    attributes, which it resolves).
    """
    if isinstance(value, list):
        return [_substituted(item) for item in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Fn::Sub"} and isinstance(value["Fn::Sub"], list):
        text, variables = value["Fn::Sub"]
        variables = _substituted(variables)
        parts: list[Any] = []
        start = 0
        for match in _SUBSTITUTION.finditer(text):
            if match.group(1) in variables:
                if text[start : match.start()]:
                    parts.append({"Fn::Sub": text[start : match.start()]})
                parts.append(variables[match.group(1)])
                start = match.end()
        if text[start:]:
            parts.append({"Fn::Sub": text[start:]})
        return {"Fn::Join": ["", parts]}
    return {k: _substituted(v) for k, v in value.items()}


def translate(template: Template) -> dict[str, Any]:
    """The template after the two transforms CloudFormation runs, for its parameters
    (tools/template/translate.py: AWS::LanguageExtensions, then SAM's), with only the resources and
    outputs those parameters create: plain CloudFormation."""
    stack = cloudformation(template.parameter_values, template.data)
    outputs = {
        name: output
        for name, output in stack.template.get("Outputs", {}).items()
        if output.get("Condition") is None or stack.conditions[output["Condition"]]
    }
    translated = dict(stack.template)
    # Conditions chosen: AWS::LanguageExtensions leaves the Fn::If SAM merged in from Globals, and SAM
    # CLI's resolver resolves both branches, one of them naming what the other store does not create.
    translated["Resources"] = _substituted(chosen(stack.conditions, stack.resources))
    translated["Outputs"] = _substituted(chosen(stack.conditions, outputs))
    return translated


class DeployedTemplate(Template):
    """A translated template whose ARNs and Refs are AWS's, for the resource types IAM sees here.

    Physical names stay the reader's (`<stack>-<LogicalId>`), so a name the code was given locally
    names the same resource here. Read-only: built once by `deployed()` from SAM's output, so resolved
    values are kept (the reader's cache key is the whole data, dumped at each read); to see a change,
    change the source template's data and call `deployed()` again.
    """

    def __init__(self, data: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(data, **kwargs)
        self._resolved: dict[str, Any] = {}

    def resolve(self, value: Any) -> Any:
        key = json.dumps(value, sort_keys=True, default=str)
        if key not in self._resolved:
            self._resolved[key] = super().resolve(value)
        return copy.deepcopy(self._resolved[key])

    def properties(self, logical_id: str) -> dict[str, Any]:
        key = f"Properties of {logical_id}"
        if key not in self._resolved:
            self._resolved[key] = super().properties(logical_id)
        properties: dict[str, Any] = copy.deepcopy(self._resolved[key])
        return properties

    def arn(self, logical_id: str) -> str:
        resource = self.resources[logical_id]
        properties = resource.get("Properties", {})
        name = self.physical_name(logical_id)
        region, account = REGION, ACCOUNT
        match resource["Type"]:
            case "AWS::Lambda::Function" | "AWS::Serverless::Function":
                return f"arn:aws:lambda:{region}:{account}:function:{name}"
            case "AWS::Lambda::Alias":
                return f"{self._function_arn(properties['FunctionName'])}:{properties['Name']}"
            case "AWS::Lambda::Version":
                return f"{self._function_arn(properties['FunctionName'])}:1"
            case "AWS::IAM::Role":
                return f"arn:aws:iam::{account}:role/{name}"
            case "AWS::Events::Rule":
                bus = self._bus_name(properties.get("EventBusName"))
                return f"arn:aws:events:{region}:{account}:rule/" + (f"{bus}/{name}" if bus else name)
            case "AWS::Logs::LogGroup":  # Fn::GetAtt Arn: the group's streams too (":*")
                return f"arn:aws:logs:{region}:{account}:log-group:{name}:*"
            case "AWS::KMS::Key":
                return f"arn:aws:kms:{region}:{account}:key/{self._key_id(logical_id)}"
            case "AWS::Scheduler::Schedule":
                group = properties.get("GroupName", "default")
                return f"arn:aws:scheduler:{region}:{account}:schedule/{group}/{name}"
            case "AWS::ApiGateway::RestApi":
                return f"arn:aws:apigateway:{region}::/restapis/{name}"
        return super().arn(logical_id)

    def _ref_value(self, logical_id: str) -> str:
        resource_type = self.resources[logical_id]["Type"]
        if resource_type in {"AWS::Lambda::Alias", "AWS::Lambda::Version"}:
            return self.arn(logical_id)
        if resource_type == "AWS::KMS::Key":
            return self._key_id(logical_id)
        return super()._ref_value(logical_id)

    def _attributes(self, logical_id: str) -> dict[str, str]:
        attributes = super()._attributes(logical_id)
        resource_type = self.resources[logical_id]["Type"]
        if resource_type == "AWS::CloudFormation::Stack":  # a nested application, translated
            given = self.application_outputs.get(logical_id, {})
            attributes |= {f"Outputs.{name}": value for name, value in given.items()}
        if resource_type == "AWS::KMS::Key":
            attributes["KeyId"] = self._key_id(logical_id)
        if resource_type == "AWS::Lambda::Version":
            attributes["Version"] = "1"
        return attributes

    def _key_id(self, logical_id: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{ACCOUNT}/{self.physical_name(logical_id)}"))

    def _function_arn(self, value: Any) -> str:
        if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in self.resources:
            return self.arn(value["Ref"])
        if isinstance(value, str) and value.startswith("arn:"):
            return value
        raise DeploymentError(f"a function named by {value!r}: name it with Ref")

    def _bus_name(self, value: Any) -> str | None:
        if value is None or value == "default":
            return None
        if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in self.resources:
            return self.physical_name(value["Ref"])
        if isinstance(value, str):
            return value.rpartition("event-bus/")[2]
        raise DeploymentError(f"a rule's bus named by {value!r}: name it with Ref")


def deployed(template: Template) -> DeployedTemplate:
    """The template as deployed with its parameters: SAM-translated, AWS's ARNs (module docstring)."""
    outputs: dict[str, dict[str, str]] = {}
    for app in template.of_type("AWS::Serverless::Application"):
        if not template.is_created(app):
            continue
        values = {
            name: str(template.resolve({"Fn::GetAtt": [app, f"Outputs.{name}"]}))
            for name in template.nested_outputs(app)
        }
        outputs[app] = {
            name: value if value.startswith("arn:") or name not in NESTED_ARNS else NESTED_ARNS[name]
            for name, value in values.items()
        }
    return DeployedTemplate(
        translate(template),
        parameters=template.parameter_values,
        stack_name=template.stack_name,
        application_outputs=outputs,
    )


def local_names(local: Template, aws: DeployedTemplate) -> dict[str, str]:
    """What the local template calls a resource (name, URL, local ARN, a nested output's placeholder)
    → its ARN as deployed: how a call recorded against the local names finds what IAM evaluates."""
    names: dict[str, str] = {}
    for logical_id in local.resources:
        if logical_id not in aws.resources or not local.is_created(logical_id):
            continue
        arn = aws.arn(logical_id)
        names[local.physical_name(logical_id)] = arn
        names[local.arn(logical_id)] = arn
        names[str(local.resolve({"Ref": logical_id}))] = arn
        if local.resources[logical_id]["Type"] == "AWS::DynamoDB::Table":
            stream = {"Fn::GetAtt": [logical_id, "StreamArn"]}
            names[str(local.resolve(stream))] = str(aws.resolve(stream))
        if local.resources[logical_id]["Type"] == "AWS::Serverless::Application":
            for output in local.nested_outputs(logical_id):
                reference = {"Fn::GetAtt": [logical_id, f"Outputs.{output}"]}
                names.setdefault(str(local.resolve(reference)), str(aws.resolve(reference)))
    return names


def partition_keys(aws: DeployedTemplate) -> dict[str, str]:
    """Each created table's ARN → its partition key attribute (KeySchema's HASH): what a call on one of
    its items carries as dynamodb:LeadingKeys (tools/iam/calls.py)."""
    keys: dict[str, str] = {}
    for logical_id in aws.of_type("AWS::DynamoDB::Table"):
        if aws.is_created(logical_id):
            schema = aws.properties(logical_id)["KeySchema"]
            [attribute] = [part["AttributeName"] for part in schema if part["KeyType"] == "HASH"]
            keys[aws.arn(logical_id)] = attribute
    return keys


# --- the policies AWS evaluates --------------------------------------------------------------------------
def _document(value: Any, where: str) -> Policy:
    if not isinstance(value, dict) or "Statement" not in value:
        raise DeploymentError(f"{where}: not a policy document: {value!r}")
    return value


def role_policies(aws: DeployedTemplate, role: str) -> tuple[tuple[str, Policy], ...]:
    """Every policy attached to a role of the template, by "<logical id>/<policy name>": its inline
    Policies, and the AWS::IAM::RolePolicy and AWS::IAM::Policy resources that name it."""
    properties = aws.properties(role)
    for unseen in ("ManagedPolicyArns", "PermissionsBoundary"):
        if properties.get(unseen):
            raise DeploymentError(f"{role}: {unseen} is not evaluated here (tools/iam/README.md)")
    name = aws.physical_name(role)
    policies = [
        (f"{role}/{policy['PolicyName']}", _document(policy["PolicyDocument"], role))
        for policy in properties.get("Policies", [])
    ]
    for logical_id in aws.of_type("AWS::IAM::RolePolicy"):
        attached = aws.properties(logical_id)
        if attached["RoleName"] == name:
            policies.append(
                (f"{logical_id}/{attached['PolicyName']}", _document(attached["PolicyDocument"], logical_id))
            )
    for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        for logical_id in aws.of_type(kind):
            attached = aws.properties(logical_id)
            if name in attached.get("Roles", []):
                policies.append((logical_id, _document(attached["PolicyDocument"], logical_id)))
    return tuple(policies)


# Resource policies of types this module does not read: a template with one is refused, not half read.
UNREAD_RESOURCE_POLICIES = (
    "AWS::DynamoDB::GlobalTable",
    "AWS::Events::EventBusPolicy",
    "AWS::S3::BucketPolicy",
    "AWS::SecretsManager::ResourcePolicy",
    "AWS::Logs::ResourcePolicy",
    "AWS::Lambda::LayerVersionPermission",
)


def resource_policies(aws: DeployedTemplate) -> dict[str, Policy]:
    """Each resource's own policy, by the resource's ARN: SQS queue policies, SNS topic policies, KMS key
    policies, DynamoDB table and stream policies, a function's Lambda permissions (one statement each)
    and each role's trust policy. (A request on a table's index is decided by the table's policy:
    `resource_policy_of`.)"""
    unread = [logical_id for kind in UNREAD_RESOURCE_POLICIES for logical_id in aws.of_type(kind)]
    if unread:
        raise DeploymentError(f"resource policies not evaluated here: {unread} (tools/iam/deployed.py)")
    policies: dict[str, Policy] = {}

    def attach(arn: str, document: Policy, where: str) -> None:
        if arn in policies:  # a queue or topic has one policy: a second one replaces the first
            raise DeploymentError(f"{where}: {arn} already has a policy")
        policies[arn] = _document(document, where)

    for logical_id in aws.of_type("AWS::SQS::QueuePolicy"):
        properties = aws.properties(logical_id)
        for url in properties["Queues"]:
            attach(queue_arn(url), properties["PolicyDocument"], logical_id)
    for logical_id in aws.of_type("AWS::SNS::TopicPolicy"):
        properties = aws.properties(logical_id)
        for topic in properties["Topics"]:
            attach(topic, properties["PolicyDocument"], logical_id)
    for logical_id in aws.of_type("AWS::KMS::Key"):
        attach(aws.arn(logical_id), aws.properties(logical_id)["KeyPolicy"], logical_id)
    for logical_id in aws.of_type("AWS::IAM::Role"):
        attach(aws.arn(logical_id), aws.properties(logical_id)["AssumeRolePolicyDocument"], logical_id)
    for logical_id in aws.of_type("AWS::DynamoDB::Table"):
        properties = aws.properties(logical_id)
        if "ResourcePolicy" in properties:
            attach(aws.arn(logical_id), properties["ResourcePolicy"]["PolicyDocument"], logical_id)
        stream = properties.get("StreamSpecification", {})
        if "ResourcePolicy" in stream:
            stream_arn = str(aws.resolve({"Fn::GetAtt": [logical_id, "StreamArn"]}))
            attach(stream_arn, stream["ResourcePolicy"]["PolicyDocument"], logical_id)
    permissions: dict[str, list[dict[str, Any]]] = {}
    for logical_id in aws.of_type("AWS::Lambda::Permission"):
        properties = aws.properties(logical_id)
        function = str(properties["FunctionName"])
        if not function.startswith("arn:"):
            function = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function}"
        principal = str(properties["Principal"])
        conditions: dict[str, dict[str, str]] = {}
        if "SourceArn" in properties:
            conditions["ArnLike"] = {"aws:SourceArn": properties["SourceArn"]}
        if "SourceAccount" in properties:
            conditions["StringEquals"] = {"aws:SourceAccount": properties["SourceAccount"]}
        statement: dict[str, Any] = {
            "Sid": logical_id,
            "Effect": "Allow",
            "Principal": {"Service": principal}
            if principal.endswith(".amazonaws.com")
            else {"AWS": principal},
            "Action": properties["Action"],
            "Resource": function,
        }
        if conditions:
            statement["Condition"] = conditions
        permissions.setdefault(function, []).append(statement)
    for function, statements in permissions.items():
        attach(function, {"Version": "2012-10-17", "Statement": statements}, "AWS::Lambda::Permission")
    return policies


def resource_policy_of(policies: Mapping[str, Policy], resource: str) -> Policy | None:
    """The policy deciding a request on a resource: its own, or its table's for a DynamoDB index."""
    if resource in policies:
        return policies[resource]
    if resource.startswith("arn:aws:dynamodb:") and "/index/" in resource:
        return policies.get(resource.split("/index/", 1)[0])
    return None
