"""Who asks AWS for what in a deployed template, as `Request`s for `decisions` (tools/iam/evaluation.py).

`Access(deployed(template))` builds the requests:

- `calls(function, touches)`: what a function's code calls (tools/iam/calls.py), by its role's session;
- `lambda_service()`: what Lambda does with each function's role: assume it, write the function's logs,
  send its traces, attach it to its VPC, and run its event source mappings (poll a queue, read a
  stream, send a batch that failed to its OnFailure destination);
- `event_bridge()`: EventBridge delivering each rule's events to its targets and their dead-letter
  queues (events.amazonaws.com, aws:SourceArn the rule);
- `scheduler()`: EventBridge Scheduler assuming each schedule's role (SAM generates it for a
  ScheduleV2 event) and invoking the target with it;
- `cloudwatch()`: CloudWatch publishing each alarm's notifications to its topics (aws:SourceArn the
  alarm) and using the topic's KMS key;
- `api_gateway()`: API Gateway invoking each route's function (aws:SourceArn the route), from the
  integrations of the API SAM generates.

Each request carries the principal's policies and the resource's own policy, and the context keys AWS
sets for it. `missing_condition_keys` names a key a policy conditions on that the request does not
carry, so a condition is never satisfied or failed by a key nobody set; `refusals` says what of a list of
decisions a test fails on.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator
from typing import Any

from tools.iam.calls import Touch
from tools.iam.deployed import (
    DeployedTemplate,
    DeploymentError,
    resource_policies,
    resource_policy_of,
    role_policies,
)
from tools.iam.evaluation import ContextValue, Decision, Policy, Request
from tools.template import ACCOUNT, REGION

LOG_STREAM = "2026/01/01/[$LATEST]0123456789abcdef0123456789abcdef"  # a stream Lambda would create
# What AWSLambdaVPCAccessExecutionRole grants: Lambda manages a function's network interfaces with its role.
NETWORK_INTERFACE_ACTIONS = (
    "ec2:CreateNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:DeleteNetworkInterface",
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
)
# What an event source mapping does with the function's role, by the source's service (Lambda's docs).
SOURCE_ACTIONS = {
    "sqs": ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"),
    "dynamodb": ("dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"),
}
# How a service delivers to a target or destination, by the target's service.
DELIVERY_ACTIONS = {
    "sqs": "sqs:SendMessage",
    "sns": "sns:Publish",
    "lambda": "lambda:InvokeFunction",
    "events": "events:PutEvents",
}
# Operators under which an absent key is part of the condition's meaning, not a key nobody set.
_ABSENCE_OPERATORS = ("IfExists", "Null")


def _service(arn: str) -> str:
    return arn.split(":")[2] if arn.startswith("arn:") else ""


def _reference(value: Any) -> str | None:
    """The logical id a Ref or Fn::GetAtt names."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return str(value["Ref"])
    if isinstance(value, dict) and set(value) == {"Fn::GetAtt"}:
        return str(value["Fn::GetAtt"][0])
    return None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class Access:
    def __init__(self, aws: DeployedTemplate) -> None:
        self.aws = aws
        self.resource_policies = resource_policies(aws)
        self._role_policies: dict[str, tuple[tuple[str, Policy], ...]] = {}

    # --- principals ----------------------------------------------------------------------------------------
    def policies_of(self, role: str) -> tuple[tuple[str, Policy], ...]:
        if role not in self._role_policies:
            self._role_policies[role] = role_policies(self.aws, role)
        return self._role_policies[role]

    def function_role(self, function: str) -> str:
        role = _reference(self.aws.resources[function]["Properties"].get("Role"))
        if role is None or self.aws.resources.get(role, {}).get("Type") != "AWS::IAM::Role":
            raise DeploymentError(f"{function}: its Role is not a role of this template")
        return role

    def session(self, role: str, session_name: str) -> str:
        return f"arn:aws:sts::{ACCOUNT}:assumed-role/{self.aws.physical_name(role)}/{session_name}"

    def by_role(
        self,
        who: str,
        role: str,
        session_name: str,
        action: str,
        resource: str,
        context: Iterable[tuple[str, ContextValue]] = (),
    ) -> Request:
        """A request made with a role's credentials: its policies, and the global keys AWS sets."""
        return Request(
            who=who,
            principal=self.session(role, session_name),
            action=action,
            resource=resource,
            identity_policies=self.policies_of(role),
            resource_policy=resource_policy_of(self.resource_policies, resource),
            context={
                "aws:PrincipalArn": self.aws.arn(role),
                "aws:PrincipalAccount": ACCOUNT,
                "aws:PrincipalType": "AssumedRole",
                "aws:RequestedRegion": REGION,
                "aws:SecureTransport": "true",
                **dict(context),
            },
        )

    def by_service(
        self, who: str, service: str, action: str, resource: str, source_arn: str | None
    ) -> Request:
        """A request a service makes as its service principal, for a resource of this account (`source_arn`:
        aws:SourceArn and aws:SourceAccount; Lambda sets neither when it assumes an execution role)."""
        context: dict[str, ContextValue] = {"aws:SecureTransport": "true"}
        if source_arn is not None:
            context |= {"aws:SourceArn": source_arn, "aws:SourceAccount": ACCOUNT}
        return Request(
            who=who,
            principal=service,
            action=action,
            resource=resource,
            resource_policy=resource_policy_of(self.resource_policies, resource),
            context=context,
        )

    # --- a function's code ---------------------------------------------------------------------------------
    def calls(self, function: str, touches: Iterable[Touch]) -> list[Request]:
        """The function's code's calls, made with its role's session (Lambda names it after the function)."""
        role = self.function_role(function)
        name = self.aws.physical_name(function)
        return [
            self.by_role(function, role, name, touch.action, touch.resource, touch.context)
            for touch in dict.fromkeys(touches)
        ]

    # --- what AWS services do on their own -----------------------------------------------------------------
    def functions(self) -> list[str]:
        return list(self.aws.of_type("AWS::Lambda::Function"))

    def _function_of(self, value: Any) -> str:
        """The function a FunctionName names (Ref to the function, or to one of its aliases)."""
        target = _reference(value)
        while target is not None and self.aws.resources[target]["Type"] in {
            "AWS::Lambda::Alias",
            "AWS::Lambda::Version",
        }:
            target = _reference(self.aws.resources[target]["Properties"]["FunctionName"])
        if target is None or self.aws.resources[target]["Type"] != "AWS::Lambda::Function":
            raise DeploymentError(f"a function named by {value!r}: name it with Ref")
        return target

    def lambda_service(self) -> list[Request]:
        requests: list[Request] = []
        for function in self.functions():
            role = self.function_role(function)
            name = self.aws.physical_name(function)
            who = f"Lambda {function}"
            requests.append(
                self.by_service(
                    f"{who} assumes its role",
                    "lambda.amazonaws.com",
                    "sts:AssumeRole",
                    self.aws.arn(role),
                    None,
                )
            )
            properties = self.aws.properties(function)
            group = properties.get("LoggingConfig", {}).get("LogGroup", f"/aws/lambda/{name}")
            stream = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:log-stream:{LOG_STREAM}"
            runs = [("logs:CreateLogStream", stream), ("logs:PutLogEvents", stream)]
            if properties.get("TracingConfig", {}).get("Mode") == "Active":
                runs += [("xray:PutTraceSegments", "*"), ("xray:PutTelemetryRecords", "*")]
            if properties.get("VpcConfig", {}).get("SubnetIds"):
                runs += [(action, "*") for action in NETWORK_INTERFACE_ACTIONS]
            requests += [self.by_role(who, role, name, action, resource) for action, resource in runs]
        for mapping in self.aws.of_type("AWS::Lambda::EventSourceMapping"):
            raw = self.aws.resources[mapping]["Properties"]
            function = self._function_of(raw["FunctionName"])
            role = self.function_role(function)
            name = self.aws.physical_name(function)
            properties = self.aws.properties(mapping)
            source = str(properties["EventSourceArn"])
            who = f"Lambda {function} mapping {mapping}"
            if _service(source) not in SOURCE_ACTIONS:
                raise DeploymentError(f"{mapping}: a source of {_service(source)} is not known here")
            runs = [(action, source) for action in SOURCE_ACTIONS[_service(source)]]
            if _service(source) == "dynamodb":
                runs.append(("dynamodb:ListStreams", "*"))
            on_failure = properties.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
            if on_failure:
                runs.append((DELIVERY_ACTIONS[_service(on_failure)], str(on_failure)))
            requests += [self.by_role(who, role, name, action, resource) for action, resource in runs]
        return requests

    def event_bridge(self) -> list[Request]:
        requests: list[Request] = []
        for rule in self.aws.of_type("AWS::Events::Rule"):
            rule_arn = self.aws.arn(rule)
            for target in self.aws.properties(rule).get("Targets", []):
                if target.get("RoleArn"):
                    raise DeploymentError(f"{rule}: a target with a role is not evaluated here")
                for arn in (target["Arn"], target.get("DeadLetterConfig", {}).get("Arn")):
                    if arn:
                        action = DELIVERY_ACTIONS[_service(arn)]
                        who = f"EventBridge {rule}"
                        requests.append(self.by_service(who, "events.amazonaws.com", action, arn, rule_arn))
        return requests

    def scheduler(self) -> list[Request]:
        requests: list[Request] = []
        group = f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule-group/"
        for schedule in self.aws.of_type("AWS::Scheduler::Schedule"):
            properties = self.aws.properties(schedule)
            role = _reference(self.aws.resources[schedule]["Properties"]["Target"]["RoleArn"])
            if role is None:
                raise DeploymentError(f"{schedule}: its RoleArn is not a role of this template")
            who = f"EventBridge Scheduler {schedule}"
            source = group + str(properties.get("GroupName", "default"))
            requests.append(
                self.by_service(
                    f"{who} assumes its role",
                    "scheduler.amazonaws.com",
                    "sts:AssumeRole",
                    self.aws.arn(role),
                    source,
                )
            )
            target = str(properties["Target"]["Arn"])
            requests.append(self.by_role(who, role, schedule, DELIVERY_ACTIONS[_service(target)], target))
        return requests

    def alarm_arn(self, alarm: str) -> str:
        return f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{self.aws.properties(alarm)['AlarmName']}"

    def _topic_key(self, topic_arn: str) -> str | None:
        """The ARN of the KMS key a topic of this template is encrypted with, if any."""
        for topic in self.aws.of_type("AWS::SNS::Topic"):
            if self.aws.arn(topic) != topic_arn:
                continue
            key = self.aws.properties(topic).get("KmsMasterKeyId")
            for logical_id in self.aws.of_type("AWS::KMS::Key"):
                if key in {self.aws.resolve({"Ref": logical_id}), self.aws.arn(logical_id)}:
                    return self.aws.arn(logical_id)
            return None if key is None else f"arn:aws:kms:{REGION}:{ACCOUNT}:{key}"  # an alias: AWS's key
        return None

    def cloudwatch(self) -> list[Request]:
        requests: list[Request] = []
        for alarm in self.aws.of_type("AWS::CloudWatch::Alarm"):
            properties = self.aws.properties(alarm)
            alarm_arn = self.alarm_arn(alarm)
            who = f"CloudWatch {alarm}"
            topics = [
                str(action)
                for kind in ("AlarmActions", "OKActions", "InsufficientDataActions")
                for action in properties.get(kind, [])
            ]
            for topic in dict.fromkeys(topics):
                if _service(topic) != "sns":
                    raise DeploymentError(f"{alarm}: an action on {topic} is not evaluated here")
                requests.append(
                    self.by_service(who, "cloudwatch.amazonaws.com", "sns:Publish", topic, alarm_arn)
                )
                key = self._topic_key(topic)
                if key is not None:  # SNS encrypts the message with the topic's key for the publisher
                    for action in ("kms:GenerateDataKey", "kms:Decrypt"):
                        requests.append(
                            self.by_service(who, "cloudwatch.amazonaws.com", action, key, alarm_arn)
                        )
        return requests

    def _routes(self, api: str) -> Iterator[tuple[str, str, str]]:
        """(method, path, integration URI) of each route of an API SAM generated the definition of."""
        body = self.aws.properties(api).get("Body", {})
        for path, methods in body.get("paths", {}).items():
            for method, operation in methods.items():
                integration = operation.get("x-amazon-apigateway-integration", {})
                if integration.get("type") == "aws_proxy":
                    yield method.upper(), path, str(integration["uri"])

    def api_gateway(self) -> list[Request]:
        requests: list[Request] = []
        for api in self.aws.of_type("AWS::ApiGateway::RestApi"):
            stages = [
                str(self.aws.properties(stage)["StageName"])
                for stage, resource in self.aws.of_type("AWS::ApiGateway::Stage").items()
                if _reference(resource["Properties"].get("RestApiId")) == api
            ]
            api_id = self.aws.resolve({"Ref": api})
            for method, path, uri in self._routes(api):
                function = uri.split("/functions/", 1)[1].rsplit("/invocations", 1)[0]
                called = "/".join("sample" if part.startswith("{") else part for part in path.split("/"))
                for stage in stages:
                    source = f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{api_id}/{stage}/{method}{called}"
                    who = f"API Gateway {api} {method} {path}"
                    requests.append(
                        self.by_service(
                            who, "apigateway.amazonaws.com", "lambda:InvokeFunction", function, source
                        )
                    )
        return requests

    def services(self) -> list[Request]:
        """What every AWS service does on its own with this template's resources."""
        return [
            *self.lambda_service(),
            *self.event_bridge(),
            *self.scheduler(),
            *self.cloudwatch(),
            *self.api_gateway(),
        ]


def _condition_keys(policy: Policy | None, action: str) -> set[str]:
    """The condition keys of the statements of a policy that can apply to an action."""
    keys: set[str] = set()
    for statement in _as_list((policy or {}).get("Statement", [])):
        patterns = _as_list(statement.get("Action", statement.get("NotAction", [])))
        matches = any(fnmatch.fnmatchcase(action.lower(), str(p).lower()) for p in patterns)
        if matches == ("NotAction" in statement):
            continue
        for operator, entries in statement.get("Condition", {}).items():
            if not operator.endswith(_ABSENCE_OPERATORS):
                keys |= {key.lower() for key in entries}
    return keys


def missing_condition_keys(request: Request) -> set[str]:
    """Keys a statement that can apply to the request conditions on, that the request does not carry."""
    keys = _condition_keys(request.resource_policy, request.action)
    for _, policy in request.identity_policies:
        keys |= _condition_keys(policy, request.action)
    return keys - {key.lower() for key in request.context}


def refusals(found: list[Decision]) -> list[str]:
    """What AWS would refuse, or could not evaluate, or decide on a condition key the call does not set."""
    return [str(decision) for decision in found if not decision.allowed] + [
        f"{decision.request}: a policy conditions on {sorted(keys)}, which the request does not set"
        for decision in found
        if (keys := missing_condition_keys(decision.request))
    ]
