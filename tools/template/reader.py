"""Reads template.yaml, the single source of truth for resource definitions, for tests and the local stack.

A template is read the way SAM CLI reads it (tools/template/README.md):
1. `samcli.yamlhelper.yaml_parse` (CloudFormation's short-form tags);
2. SAM CLI's AWS::LanguageExtensions code (`samcli.lib.cfn_language_extensions`) expands Fn::ForEach and
   resolves the Fn::FindInMap lookups that need no parameter, as CloudFormation's transform does before
   the SAM transform. That is `Template.data`: parameters and resource references stay intrinsics, so
   a Template built on the same data with other parameter values resolves them anew;
3. for resolved views (`properties`, `function`, `resolve`, `outputs`, `conditions`), the SAM
   translator's plugins merge Globals into the resources (`SamTranslatorWrapper.run_plugins`, what
   `sam local` runs) and `samcli.lib.intrinsic_resolver` resolves every intrinsic against the parameter
   values and the local physical names and ARNs (its logical-id translator).
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from samcli.lib.cfn_language_extensions.api import create_default_intrinsic_resolver  # type: ignore[import-untyped]
from samcli.lib.cfn_language_extensions.exceptions import InvalidTemplateException  # type: ignore[import-untyped]
from samcli.lib.cfn_language_extensions.models import (  # type: ignore[import-untyped]
    PseudoParameterValues,
    ResolutionMode,
    TemplateProcessingContext,
)
from samcli.lib.cfn_language_extensions.pipeline import ProcessingPipeline  # type: ignore[import-untyped]
from samcli.lib.cfn_language_extensions.processors import ForEachProcessor, TemplateParsingProcessor  # type: ignore[import-untyped]
from samcli.lib.cfn_language_extensions.resolvers import (  # type: ignore[import-untyped]
    FnFindInMapResolver,
)
from samcli.lib.cfn_language_extensions.resolvers import (
    IntrinsicResolver as LanguageExtensionsResolver,
)
from samcli.lib.cfn_language_extensions.sam_integration import check_using_language_extension  # type: ignore[import-untyped]
from samcli.lib.intrinsic_resolver.intrinsic_property_resolver import IntrinsicResolver  # type: ignore[import-untyped]
from samcli.lib.intrinsic_resolver.intrinsics_symbol_table import IntrinsicsSymbolTable  # type: ignore[import-untyped]
from samcli.lib.intrinsic_resolver.invalid_intrinsic_exception import (  # type: ignore[import-untyped]
    InvalidIntrinsicException,
    InvalidSymbolException,
)
from samcli.lib.samlib.wrapper import SamTranslatorWrapper  # type: ignore[import-untyped]
from samcli.yamlhelper import yaml_parse  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]  # the repository (tools/template/reader.py)
TEMPLATE_PATH = ROOT / "template.yaml"
REGION = "us-east-1"
ACCOUNT = "123456789012"
NO_VALUE = object()
# SAM's resolver turns AWS::NoValue into None and then rejects None inside Fn::If (it resolves both
# branches): the translator gives it this marker instead, and resolved values drop it.
_NO_VALUE_MARKER = "\u0000AWS::NoValue"
PSEUDO_PARAMETERS = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}


class TemplateError(ValueError):
    pass


def parse_yaml(text: str, where: object = "template") -> dict[str, Any]:
    """A template's text as written (loops unexpanded), by SAM CLI's parser."""
    try:
        data = yaml_parse(text)
    except ValueError as exc:
        raise TemplateError(f"{where}: {exc}") from exc
    if not isinstance(data, dict):
        raise TemplateError(f"{where} is not a template")
    plain: dict[str, Any] = _plain(data)
    return plain


def _plain(value: Any) -> Any:
    """SAM's parser gives OrderedDicts; plain dicts and lists dump back to YAML with yaml.safe_dump."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def load_yaml(path: Path) -> dict[str, Any]:
    """A template file as the SAM transform receives it: AWS::LanguageExtensions applied (see above)."""
    return expand_language_extensions(parse_yaml(path.read_text(), path))


def expand_language_extensions(data: dict[str, Any]) -> dict[str, Any]:
    """Fn::ForEach expanded and parameter-free Fn::FindInMap resolved, with SAM CLI's own processors.

    Only those two: SAM CLI's full pipeline (`expand_language_extensions`) also resolves parameters and
    pseudo parameters into the resources, which would freeze them, and its partial Fn::Sub resolution
    returns a plain string with the resource placeholders left in it (tools/template/README.md).
    """
    if not check_using_language_extension(data):
        return data
    defaults = {name: spec.get("Default") for name, spec in (data.get("Parameters") or {}).items()}
    context = TemplateProcessingContext(
        fragment=copy.deepcopy(data),
        parameter_values={k: v for k, v in defaults.items() if v is not None},
        pseudo_parameters=PseudoParameterValues(region=REGION, account_id=ACCOUNT),
        resolution_mode=ResolutionMode.PARTIAL,
    )
    # The collection resolver (a list, or a Ref to a CommaDelimitedList parameter's default) is SAM's.
    pipeline = ProcessingPipeline(
        [
            TemplateParsingProcessor(),
            ForEachProcessor(intrinsic_resolver=create_default_intrinsic_resolver(context)),
        ]
    )
    try:
        expanded: dict[str, Any] = pipeline.process_template(context)
        lookups = LanguageExtensionsResolver(context)
        lookups.register_resolver(FnFindInMapResolver)
        for section in ("Resources", "Outputs"):
            if section in expanded:
                expanded[section] = _resolve_static_lookups(expanded[section], lookups)
    except InvalidTemplateException as exc:
        raise TemplateError(str(exc)) from exc
    return expanded


def _resolve_static_lookups(value: Any, lookups: LanguageExtensionsResolver) -> Any:
    """What the transform resolves without parameters, once a loop's identifier is substituted.

    Fn::FindInMap with literal keys becomes its value, and Fn::Sub of a string with no variable left
    (a loop's `!Sub "${Consumer}Queue"`) becomes that string, so `!Ref {"Fn::Sub": ...}` is a plain Ref.
    """
    if isinstance(value, list):
        return [_resolve_static_lookups(item, lookups) for item in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Fn::Sub"} and isinstance(value["Fn::Sub"], str) and "${" not in value["Fn::Sub"]:
        return value["Fn::Sub"]
    if set(value) == {"Fn::FindInMap"}:
        args = value["Fn::FindInMap"]
        if isinstance(args, list) and all(isinstance(a, str) for a in args[:3]):
            return copy.deepcopy(lookups.resolve_value(value))
    return {k: _resolve_static_lookups(v, lookups) for k, v in value.items()}


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    code_uri: Path
    handler: str
    timeout: int
    environment: dict[str, str]
    events: dict[str, dict[str, Any]]
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


def _without_no_value(value: Any) -> Any:
    """AWS::NoValue drops the property or list item, as CloudFormation does."""
    if isinstance(value, list):
        return [_without_no_value(item) for item in value if item != _NO_VALUE_MARKER]
    if isinstance(value, dict):
        return {k: _without_no_value(v) for k, v in value.items() if v != _NO_VALUE_MARKER}
    return value


@dataclass(frozen=True)
class _View:
    """One resolution state of the data: SAM's plugins applied, and the resolver over it."""

    processed: dict[str, Any]
    resolver: IntrinsicResolver


class Template:
    def __init__(
        self,
        data: dict[str, Any],
        parameters: Mapping[str, str] | None = None,
        stack_name: str = "local",
        application_outputs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        # Data already expanded (Template.load, or a copy of another Template's data) is kept as given:
        # callers may adjust it afterwards and every view reads it anew.
        self.data = expand_language_extensions(data)
        self.stack_name = stack_name
        self.parameter_values = {
            name: str(spec.get("Default", "")) for name, spec in data.get("Parameters", {}).items()
        }
        self.parameter_values.update(parameters or {})
        # What a nested application's outputs are locally (the local stack stands in for the order
        # database's: its embedded server), by logical id; others read as placeholders.
        self.application_outputs = {k: dict(v) for k, v in (application_outputs or {}).items()}
        self._views: dict[str, _View] = {}

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
        value = resource.get("Properties", {}).get(flag, False)
        if isinstance(value, dict):  # a parameter or condition decides
            value = self.resolve(value)
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

    def _ref_value(self, logical_id: str) -> str:
        resource_type = self.resources[logical_id]["Type"]
        if resource_type == "AWS::SQS::Queue":
            return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{self.physical_name(logical_id)}"
        if resource_type == "AWS::SNS::Topic":
            return self.arn(logical_id)
        return self.physical_name(logical_id)

    def _attributes(self, logical_id: str) -> dict[str, str]:
        """What Ref and Fn::GetAtt give for a resource locally: the resolver's logical-id translation."""
        attributes = {"Ref": self._ref_value(logical_id), "Arn": self.arn(logical_id)}
        resource_type = self.resources[logical_id]["Type"]
        if resource_type == "AWS::DynamoDB::Table":
            attributes["StreamArn"] = f"{self.arn(logical_id)}/stream/local"
        if resource_type == "AWS::SQS::Queue":
            attributes |= {
                "QueueName": self.physical_name(logical_id),
                "QueueUrl": self._ref_value(logical_id),
            }
        if resource_type == "AWS::SNS::Topic":
            attributes |= {"TopicName": self.physical_name(logical_id), "TopicArn": self.arn(logical_id)}
        if resource_type == "AWS::Events::EventBus":
            attributes["Name"] = self.physical_name(logical_id)
        if resource_type == "AWS::Serverless::Application":
            given = self.application_outputs.get(logical_id, {})
            attributes |= {
                f"Outputs.{name}": given.get(name, f"{self.physical_name(logical_id)}-{name}")
                for name in self.nested_outputs(logical_id)
            }
        return attributes

    def nested_outputs(self, logical_id: str) -> list[str]:
        """The output names of a nested application whose Location is a file of this repository."""
        location = self.resources[logical_id].get("Properties", {}).get("Location")
        if not isinstance(location, str):
            return []  # a Serverless Application Repository application: not read locally
        return list(load_yaml(ROOT / location).get("Outputs", {}))

    # --- SAM's plugins and intrinsic resolver -----------------------------------------------------
    def _view(self) -> _View:
        """The data with SAM's plugins applied and a resolver for it, cached while the data is unchanged."""
        key = hashlib.sha256(
            json.dumps(
                [self.data, self.parameter_values, self.stack_name, self.application_outputs],
                sort_keys=True,
                default=str,
            ).encode()
        ).hexdigest()
        view = self._views.get(key)
        if view is None:
            values: dict[str, Any] = {**PSEUDO_PARAMETERS, "AWS::StackName": self.stack_name}
            values.update(self.parameter_values)
            try:
                # What `sam local` runs (SamBaseProvider.get_template): Globals and the other plugins.
                # (Its schema validation warns that samtranslator deprecates its own validator.)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    processed = SamTranslatorWrapper(self.data, parameter_values=values).run_plugins(
                        convert_local_uris=False
                    )
            except Exception as exc:  # SAM raises its own exception types for an invalid document
                raise TemplateError(f"SAM could not read the template: {exc}") from exc
            translator: dict[str, Any] = {**values, "AWS::NoValue": _NO_VALUE_MARKER}
            translator.update({logical_id: self._attributes(logical_id) for logical_id in self.resources})
            symbols = IntrinsicsSymbolTable(template=processed, logical_id_translator=translator)
            view = _View(processed, IntrinsicResolver(template=processed, symbol_resolver=symbols))
            self._views = {key: view}
        return view

    @property
    def conditions(self) -> dict[str, bool]:
        return {name: bool(self.resolve(expr)) for name, expr in self.data.get("Conditions", {}).items()}

    def resolve(self, value: Any) -> Any:
        """Resolve intrinsics in a template fragment; properties resolving to AWS::NoValue vanish."""
        if not isinstance(value, (dict, list)):
            return value  # a literal (None: an absent property)
        if isinstance(value, dict) and set(value) == {"Condition"}:
            return self.conditions[value["Condition"]]
        try:
            resolved = self._view().resolver.intrinsic_property_resolver(
                copy.deepcopy(value), ignore_errors=False
            )
        except (InvalidIntrinsicException, InvalidSymbolException) as exc:
            raise TemplateError(f"cannot resolve {value!r}: {exc}") from exc
        return NO_VALUE if resolved == _NO_VALUE_MARKER else _without_no_value(resolved)

    # --- typed views ------------------------------------------------------------------------------
    def properties(self, logical_id: str) -> dict[str, Any]:
        """A resource's properties as deployed: SAM's Globals merged in, every intrinsic resolved."""
        raw = self._view().processed["Resources"][logical_id].get("Properties", {})
        resolved = self.resolve(raw)
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
        """A function's configuration with Globals merged by SAM's plugin (lists appended, maps merged)."""
        merged = self._view().processed["Resources"][logical_id].get("Properties", {})
        props = self.properties(logical_id)
        layer_dirs, external_layers = self._layers(merged.get("Layers", []))
        return FunctionSpec(
            logical_id=logical_id,
            code_uri=ROOT / props["CodeUri"],
            handler=props.get("Handler", "app.lambda_handler"),
            timeout=int(props.get("Timeout", 3)),
            environment={
                k: _env_value(v) for k, v in props.get("Environment", {}).get("Variables", {}).items()
            },
            events=props.get("Events", {}),
            memory_size=int(props.get("MemorySize", 128)),
            runtime=str(props.get("Runtime", "")),
            layer_dirs=layer_dirs,
            external_layers=external_layers,
            reserved_concurrency=_optional_int(props.get("ReservedConcurrentExecutions")),
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
            if (
                resource["Type"] == "AWS::DynamoDB::Table"
                and self._attributes(logical_id)["StreamArn"] == arn
            ):
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
