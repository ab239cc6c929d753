"""Reads template.yaml, the single source of truth for resource definitions, for tests and the local stack.

It understands the CloudFormation short-form tags and resolves the intrinsics the template uses
(Ref, Fn::Sub, Fn::GetAtt, Fn::If, Fn::Equals, Fn::Join, Fn::Select) against parameter values and
local physical names, so local resources are built from the same definitions as the cloud ones.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the repository (tools/local/template.py)
TEMPLATE_PATH = ROOT / "template.yaml"
REGION = "us-east-1"
ACCOUNT = "123456789012"
NO_VALUE = object()


class TemplateError(ValueError):
    pass


class _Tagged:
    def __init__(self, tag: str, value: Any) -> None:
        self.tag = tag
        self.value = value


def _construct(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if suffix == "Ref" else f"Fn::{suffix}"
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if name == "Fn::GetAtt":
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


class _CfnLoader(yaml.SafeLoader):
    pass


_CfnLoader.add_multi_constructor("!", _construct)


def load_yaml(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        data = yaml.load(handle, Loader=_CfnLoader)  # noqa: S506 - SafeLoader subclass
    if not isinstance(data, dict):
        raise TemplateError(f"{path} is not a template")
    return data


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    code_uri: Path
    handler: str
    timeout: int
    environment: dict[str, str]
    events: dict[str, dict[str, Any]]
    policies: list[Any]
    memory_size: int = 128
    runtime: str = ""
    # Source directories of the template's own layers, in the order Lambda puts them on sys.path.
    layer_dirs: tuple[Path, ...] = ()
    # Layers given as ARNs of other accounts or stacks: not available locally.
    external_layers: tuple[str, ...] = ()
    # ReservedConcurrentExecutions: the most environments the function may have at once.
    reserved_concurrency: int | None = None


def _env_value(value: Any) -> str:
    # CloudFormation turns YAML booleans into "true"/"false", not Python's "True"/"False".
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None or value is NO_VALUE or value == "" else int(value)


class Template:
    def __init__(
        self,
        data: dict[str, Any],
        parameters: Mapping[str, str] | None = None,
        stack_name: str = "local",
    ) -> None:
        self.data = data
        self.stack_name = stack_name
        self.parameter_values = {
            name: str(spec.get("Default", "")) for name, spec in data.get("Parameters", {}).items()
        }
        self.parameter_values.update(parameters or {})

    @classmethod
    def load(cls, path: Path = TEMPLATE_PATH, **kwargs: Any) -> Template:
        return cls(load_yaml(path), **kwargs)

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return dict(self.data["Resources"])

    def of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.resources.items() if v["Type"] == resource_type}

    # --- physical names ---------------------------------------------------------------------------
    def physical_name(self, logical_id: str) -> str:
        """Local stand-in for the name CloudFormation would generate."""
        name = f"{self.stack_name}-{logical_id}"
        # FIFO queues and topics must have names ending in .fifo; CloudFormation appends it too.
        if self._is_fifo(logical_id):
            name += ".fifo"
        return name

    def _is_fifo(self, logical_id: str) -> bool:
        resource = self.resources.get(logical_id, {})
        flag = {"AWS::SQS::Queue": "FifoQueue", "AWS::SNS::Topic": "FifoTopic"}.get(resource.get("Type", ""))
        if flag is None:
            return False
        value = self.resolve(resource.get("Properties", {}).get(flag, False))
        return str(value).lower() == "true"

    def arn(self, logical_id: str) -> str:
        resource = self.resources[logical_id]
        name = self.physical_name(logical_id)
        service = {
            "AWS::DynamoDB::Table": f"dynamodb:{REGION}:{ACCOUNT}:table/{name}",
            "AWS::SQS::Queue": f"sqs:{REGION}:{ACCOUNT}:{name}",
            "AWS::SNS::Topic": f"sns:{REGION}:{ACCOUNT}:{name}",
            "AWS::Events::EventBus": f"events:{REGION}:{ACCOUNT}:event-bus/{name}",
            "AWS::Serverless::Function": f"lambda:{REGION}:{ACCOUNT}:function:{name}",
        }.get(resource["Type"], f"local:{REGION}:{ACCOUNT}:{name}")
        return f"arn:aws:{service}"

    def _get_att(self, logical_id: str, attribute: str) -> str:
        if attribute == "Arn":
            return self.arn(logical_id)
        if attribute == "StreamArn":
            return f"{self.arn(logical_id)}/stream/local"
        if attribute in {"QueueName", "TopicName", "Name"}:
            return self.physical_name(logical_id)
        if attribute == "QueueUrl":
            return str(self._ref(logical_id))
        if attribute == "TopicArn":
            return self.arn(logical_id)
        raise TemplateError(f"unsupported attribute {logical_id}.{attribute}")

    def _ref(self, name: str) -> Any:
        pseudo = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::StackName": self.stack_name,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": NO_VALUE,
        }
        if name in pseudo:
            return pseudo[name]
        if name in self.parameter_values:
            return self.parameter_values[name]
        if name in self.resources:
            resource_type = self.resources[name]["Type"]
            if resource_type == "AWS::SQS::Queue":
                return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{self.physical_name(name)}"
            if resource_type == "AWS::SNS::Topic":
                return self.arn(name)
            return self.physical_name(name)
        raise TemplateError(f"unresolvable Ref {name}")

    @cached_property
    def conditions(self) -> dict[str, bool]:
        return {name: bool(self.resolve(expr)) for name, expr in self.data.get("Conditions", {}).items()}

    def resolve(self, value: Any) -> Any:
        """Resolve intrinsics in a template fragment; properties resolving to AWS::NoValue vanish."""
        if isinstance(value, list):
            return [v for v in (self.resolve(item) for item in value) if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self._ref(arg)
            if key == "Fn::GetAtt":
                logical_id, attribute = arg if isinstance(arg, list) else str(arg).split(".", 1)
                return self._get_att(logical_id, attribute)
            if key == "Fn::Sub":
                return self._sub(arg)
            if key == "Fn::If":
                name, when_true, when_false = arg
                return self.resolve(when_true if self.conditions[name] else when_false)
            if key == "Fn::Equals":
                left, right = (self.resolve(v) for v in arg)
                return str(left) == str(right)
            if key == "Fn::Not":
                return not self.resolve(arg[0])
            if key == "Fn::Join":
                separator, items = arg
                return str(separator).join(str(v) for v in self.resolve(items))
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Condition":
                return self.conditions[arg]
        return {k: v for k, v in ((k, self.resolve(v)) for k, v in value.items()) if v is not NO_VALUE}

    def _sub(self, arg: Any) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in variables:
                return str(self.resolve(variables[name]))
            if "." in name and not name.startswith("AWS::"):
                logical_id, attribute = name.split(".", 1)
                return self._get_att(logical_id, attribute)
            return str(self._ref(name))

        return re.sub(r"\$\{([^}!]+)\}", replace, text)

    # --- typed views ------------------------------------------------------------------------------
    def properties(self, logical_id: str) -> dict[str, Any]:
        resolved = self.resolve(self.resources[logical_id].get("Properties", {}))
        assert isinstance(resolved, dict)
        return resolved

    def create_table_kwargs(self, logical_id: str) -> dict[str, Any]:
        """CreateTable arguments for a table, from its definition (keys, GSIs, stream)."""
        props = self.properties(logical_id)
        kwargs: dict[str, Any] = {
            "TableName": self.physical_name(logical_id),
            "AttributeDefinitions": props["AttributeDefinitions"],
            "KeySchema": props["KeySchema"],
            "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
        }
        if props.get("GlobalSecondaryIndexes"):
            kwargs["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
        if props.get("StreamSpecification"):
            kwargs["StreamSpecification"] = {
                "StreamEnabled": True,
                "StreamViewType": props["StreamSpecification"]["StreamViewType"],
            }
        return kwargs

    def ttl_attribute(self, logical_id: str) -> str | None:
        ttl = self.properties(logical_id).get("TimeToLiveSpecification")
        return str(ttl["AttributeName"]) if ttl and ttl.get("Enabled") else None

    def function(self, logical_id: str) -> FunctionSpec:
        globals_ = self.resolve(self.data.get("Globals", {}).get("Function", {}))
        props = self.properties(logical_id)
        environment = {
            **globals_.get("Environment", {}).get("Variables", {}),
            **props.get("Environment", {}).get("Variables", {}),
        }
        raw_globals = self.data.get("Globals", {}).get("Function", {})
        raw_props = self.resources[logical_id].get("Properties", {})
        # Function Layers are appended to the Globals layers (SAM's merge rule for lists).
        layer_dirs, external_layers = self._layers(
            [*raw_globals.get("Layers", []), *raw_props.get("Layers", [])]
        )
        return FunctionSpec(
            logical_id=logical_id,
            code_uri=ROOT / props["CodeUri"],
            handler=props.get("Handler", globals_.get("Handler", "app.lambda_handler")),
            timeout=int(props.get("Timeout", globals_.get("Timeout", 3))),
            environment={k: _env_value(v) for k, v in environment.items()},
            events=props.get("Events", {}),
            policies=props.get("Policies", []),
            memory_size=int(props.get("MemorySize", globals_.get("MemorySize", 128))),
            runtime=str(props.get("Runtime", globals_.get("Runtime", ""))),
            layer_dirs=layer_dirs,
            external_layers=external_layers,
            reserved_concurrency=_optional_int(
                props.get("ReservedConcurrentExecutions", globals_.get("ReservedConcurrentExecutions"))
            ),
        )

    def is_created(self, logical_id: str) -> bool:
        """False when the resource's Condition is false (CloudFormation would not create it)."""
        condition = self.resources[logical_id].get("Condition")
        return condition is None or self.conditions[condition]

    def outputs(self) -> dict[str, str]:
        """The stack outputs as they would read for the local stack (OutputKey → value)."""
        return {
            name: str(self.resolve(output["Value"]))
            for name, output in self.data.get("Outputs", {}).items()
            if "Condition" not in output or self.conditions[output["Condition"]]
        }

    def logical_id_for_arn(self, arn: str) -> str | None:
        """The resource whose local ARN (or stream ARN) this is, if any."""
        for logical_id, resource in self.resources.items():
            if self.arn(logical_id) == arn:
                return logical_id
            if resource["Type"] == "AWS::DynamoDB::Table" and self._get_att(logical_id, "StreamArn") == arn:
                return logical_id
        return None

    def _layers(self, raw_layers: list[Any]) -> tuple[tuple[Path, ...], tuple[str, ...]]:
        local_dirs: list[Path] = []
        external: list[str] = []
        for layer in raw_layers:
            name = layer.get("Ref") if isinstance(layer, dict) else None
            if isinstance(name, str) and self.resources.get(name, {}).get("Type") in {
                "AWS::Serverless::LayerVersion",
                "AWS::Lambda::LayerVersion",
            }:
                props = self.properties(name)
                content = props.get("ContentUri", props.get("Content", ""))
                if isinstance(content, str):
                    local_dirs.append(ROOT / content)
                    continue
            external.append(str(self.resolve(layer)))
        return tuple(local_dirs), tuple(external)

    def functions(self) -> dict[str, FunctionSpec]:
        return {name: self.function(name) for name in self.of_type("AWS::Serverless::Function")}
