"""template.yaml as CloudFormation sees it after `sam deploy`, and what a change of parameters does to it.

`translate(parameters)` runs the two transforms CloudFormation runs on the template `sam deploy` sends,
with the stack's parameter values, and reads the nested application's own template with the parameters
the parent passes it (tools/template/README.md, "What CloudFormation sees"):

1. **AWS::LanguageExtensions**: SAM CLI's implementation (`samcli.lib.cfn_language_extensions`), the
   whole pipeline with the parameter values, as the transform has them: Fn::ForEach expanded, Fn::If on
   conditions of parameters resolved, Refs to parameters and the pseudo parameters a transform is given
   (Region, AccountId; the Partition and URL suffix derived from them) replaced by their values, in
   Resources, Conditions and Outputs (Globals is not a section the transform processes). Two of SAM
   CLI's resolvers flatten what they cannot resolve into plain strings (a partial Fn::Sub loses its
   `Fn::Sub` and keeps `${OrdersApi}` as text; an Fn::Join of a resource reference joins its Python
   repr): here they keep the intrinsic instead, with what could be substituted substituted.
2. **AWS::Serverless-2016-10-31**: samtranslator's `transform`, as CloudFormation runs it after the
   language extensions, with the code where `sam package` puts it (an S3 object per code directory,
   the same for every parameter value) and no managed policy (the template attaches none).
3. **Nested applications** (`AWS::Serverless::Application` with a `Location` in this repository): the
   child template, parsed, with the `Parameters` the parent's translated `AWS::CloudFormation::Stack`
   passes; CloudFormation compares its resources in the nested stack's own update.

`changes(before, after)` compares two translations resource by resource, on resolved properties (Refs
to parameters and pseudo parameters, conditions, Fn::If, Fn::Sub, Fn::Join, Fn::Select, Fn::Split and
Fn::FindInMap resolved; references to other resources kept as they are written: CloudFormation resolves
them to the same physical id unless that resource is replaced). A resource that references a replaced
resource, or a nested stack output whose value changes, is updated too (and replaced if the reference
is in a property whose update requires replacement). A changed logical id (SAM's hashed Version and
Deployment ids) is an add and a remove.

"replace" is reported only for the resource types of `REPLACEMENT`, from CloudFormation's resource
reference pages; a changed property of any other type is a "modify" whatever CloudFormation would do.
"""

from __future__ import annotations

import copy
import hashlib
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import boto3
from samcli.lib.cfn_language_extensions.api import IntrinsicResolverProcessor  # type: ignore[import-untyped]
from samcli.lib.cfn_language_extensions.exceptions import InvalidTemplateException  # type: ignore[import-untyped]
from samcli.lib.cfn_language_extensions.models import (  # type: ignore[import-untyped]
    PseudoParameterValues,
    ResolutionMode,
    TemplateProcessingContext,
)
from samcli.lib.cfn_language_extensions.pipeline import ProcessingPipeline  # type: ignore[import-untyped]
from samcli.lib.cfn_language_extensions.processors import (  # type: ignore[import-untyped]
    DeletionPolicyProcessor,
    ForEachProcessor,
    TemplateParsingProcessor,
    UpdateReplacePolicyProcessor,
)
from samcli.lib.cfn_language_extensions.resolvers import (  # type: ignore[import-untyped]
    ConditionResolver,
    FnBase64Resolver,
    FnFindInMapResolver,
    FnIfResolver,
    FnJoinResolver,
    FnLengthResolver,
    FnRefResolver,
    FnSelectResolver,
    FnSplitResolver,
    FnSubResolver,
    FnToJsonStringResolver,
    IntrinsicResolver,
)
from samtranslator.metrics.metrics import Metrics  # type: ignore[import-untyped]
from samtranslator.parser.parser import Parser  # type: ignore[import-untyped]
from samtranslator.translator.translator import Translator  # type: ignore[import-untyped]
from samtranslator.utils.py27hash_fix import (  # type: ignore[import-untyped]
    to_py27_compatible_template,
    undo_mark_unicode_str_in_template,
)

from tools.template.reader import (
    ACCOUNT,
    REGION,
    ROOT,
    TEMPLATE_PATH,
    TemplateError,
    expand_language_extensions,
    load_yaml,
)

ARTIFACTS = "s3://sam-artifacts"
PSEUDO_PARAMETERS = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}

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

Action = Literal["add", "remove", "modify", "replace", "unchanged"]


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE: Any = _NoValue()
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


# --- 1. AWS::LanguageExtensions ---------------------------------------------------------------------


def _is_intrinsic(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _INTRINSICS


_INTRINSICS = frozenset(
    {
        "Ref",
        "Condition",
        "Fn::Base64",
        "Fn::Cidr",
        "Fn::FindInMap",
        "Fn::GetAtt",
        "Fn::GetAZs",
        "Fn::If",
        "Fn::ImportValue",
        "Fn::Join",
        "Fn::Length",
        "Fn::Select",
        "Fn::Split",
        "Fn::Sub",
        "Fn::ToJsonString",
        "Fn::Transform",
        "Fn::Equals",
        "Fn::And",
        "Fn::Or",
        "Fn::Not",
    }
)


class _KeepingSub(FnSubResolver):  # type: ignore[misc]
    """Fn::Sub as the transform leaves it when a placeholder names a resource: still an Fn::Sub."""

    def resolve(self, value: dict[str, Any]) -> Any:
        template_string, variables = self._parse_args(self.get_function_args(value))
        resolved = self._resolve_variable_map(variables)
        kept: dict[str, Any] = {}

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return match.group(0)  # an escape: stays while the Fn::Sub stays
            found = self._resolve_variable(name, resolved)
            if found is None or _is_intrinsic(found) or isinstance(found, (dict, list)):
                if name in resolved:
                    kept[name] = resolved[name]
                return match.group(0)
            return str(self._value_to_string(found))

        text = _PLACEHOLDER.sub(substitute, template_string)
        if not any(not m.group(1).startswith("!") for m in _PLACEHOLDER.finditer(text)):
            return _PLACEHOLDER.sub(lambda m: "${" + m.group(1)[1:] + "}", text)
        return {"Fn::Sub": [text, kept] if kept else text}


class _KeepingJoin(FnJoinResolver):  # type: ignore[misc]
    """Fn::Join of a value only CloudFormation knows (a resource's id) stays an Fn::Join."""

    def resolve(self, value: dict[str, Any]) -> Any:
        args = self.get_function_args(value)
        if isinstance(args, list) and len(args) == 2:
            items = self.parent.resolve_value(args[1]) if self.parent is not None else args[1]
            if isinstance(items, list) and any(isinstance(item, (dict, list)) for item in items):
                delimiter = self.parent.resolve_value(args[0]) if self.parent is not None else args[0]
                return {"Fn::Join": [delimiter, items]}
        return super().resolve(value)


def language_extensions(data: Mapping[str, Any], parameters: Mapping[str, str]) -> dict[str, Any]:
    """The AWS::LanguageExtensions transform with these parameter values (SAM CLI's processors)."""
    context = TemplateProcessingContext(
        fragment=copy.deepcopy(dict(data)),
        parameter_values=dict(parameters),
        pseudo_parameters=PseudoParameterValues(region=REGION, account_id=ACCOUNT),
        resolution_mode=ResolutionMode.PARTIAL,
    )
    resolver = IntrinsicResolver(context)
    for resolver_class in (
        ConditionResolver,
        FnIfResolver,
        FnRefResolver,
        FnBase64Resolver,
        _KeepingJoin,
        FnSplitResolver,
        _KeepingSub,
        FnSelectResolver,
        FnLengthResolver,
        FnFindInMapResolver,
        FnToJsonStringResolver,
    ):
        resolver.register_resolver(resolver_class)
    pipeline = ProcessingPipeline(
        [
            TemplateParsingProcessor(),
            ForEachProcessor(intrinsic_resolver=resolver),
            IntrinsicResolverProcessor(resolver),
            DeletionPolicyProcessor(),
            UpdateReplacePolicyProcessor(),
        ]
    )
    try:
        processed: dict[str, Any] = pipeline.process_template(context)
    except InvalidTemplateException as exc:
        raise TemplateError(f"AWS::LanguageExtensions: {exc}") from exc
    return processed


# --- 2. the SAM transform ---------------------------------------------------------------------------


class _NoManagedPolicies:
    """The template attaches no AWS managed policy, so SAM never needs their ARNs."""

    def load(self) -> dict[str, str]:
        return {}


def _artifact(path: str, suffix: str) -> str:
    return f"{ARTIFACTS}/{hashlib.sha256(path.encode()).hexdigest()[:32]}{suffix}"


def _packaged(template: dict[str, Any]) -> None:
    """What `sam package` does to local paths: code, layers and child templates uploaded, S3 in place."""
    for resource in template.get("Resources", {}).values():
        properties = resource.get("Properties") or {}
        kind = resource.get("Type")
        if kind == "AWS::Serverless::Function" and isinstance(properties.get("CodeUri"), str):
            properties["CodeUri"] = _artifact(properties["CodeUri"], ".zip")
        if kind == "AWS::Serverless::LayerVersion" and isinstance(properties.get("ContentUri"), str):
            properties["ContentUri"] = _artifact(properties["ContentUri"], ".zip")
        if kind == "AWS::Serverless::Application" and _is_local(properties.get("Location")):
            key = _artifact(properties["Location"], ".template").removeprefix("s3://")
            properties["Location"] = f"https://s3.{REGION}.amazonaws.com/{key}"


def _is_local(location: Any) -> bool:
    return isinstance(location, str) and "://" not in location


def _nested_templates(data: Mapping[str, Any], base: Path) -> dict[str, Path]:
    """The nested applications whose template is a file beside this one, by logical id."""
    return {
        logical_id: base / resource["Properties"]["Location"]
        for logical_id, resource in (data.get("Resources") or {}).items()
        if resource.get("Type") == "AWS::Serverless::Application"
        and _is_local((resource.get("Properties") or {}).get("Location"))
    }


def sam_transform(template: Mapping[str, Any], parameters: Mapping[str, str]) -> dict[str, Any]:
    fragment = copy.deepcopy(dict(template))
    transforms = fragment.get("Transform")
    rest = [t for t in (transforms if isinstance(transforms, list) else [transforms]) if t]
    rest = [t for t in rest if t not in ("AWS::LanguageExtensions", "AWS::Serverless-2016-10-31")]
    fragment.pop("Transform", None)
    if rest:
        raise TemplateError(f"transforms not translated here: {rest}")
    fragment["Transform"] = "AWS::Serverless-2016-10-31"
    _packaged(fragment)
    values: dict[str, Any] = {**parameters, **PSEUDO_PARAMETERS}
    # What samtranslator.translator.transform.transform does, with the Region given rather than read
    # from the environment, and its metrics (a dummy publisher) published so that they go quietly.
    metrics = Metrics()
    translator = Translator(
        None, Parser(), boto_session=boto3.session.Session(region_name=REGION), metrics=metrics
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            to_py27_compatible_template(fragment, values)
            translated: dict[str, Any] = undo_mark_unicode_str_in_template(
                translator.translate(
                    fragment, parameter_values=values, get_managed_policy_map=_NoManagedPolicies().load
                )
            )
    except Exception as exc:  # samtranslator raises its own types for an invalid document
        raise TemplateError(f"SAM transform: {exc}") from exc
    finally:
        metrics.publish()
    return translated


# --- what a stack holds for given parameters --------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    """One stack's template as CloudFormation processes it, with its parameters and conditions."""

    template: dict[str, Any]
    parameters: dict[str, str]
    conditions: dict[str, bool]
    nested: dict[str, Stack] = field(default_factory=dict)  # by the parent's logical id

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        """The resources CloudFormation creates (their Condition true)."""
        return {
            logical_id: resource
            for logical_id, resource in self.template.get("Resources", {}).items()
            if resource.get("Condition") is None or self.conditions[resource["Condition"]]
        }

    def resolve(self, value: Any) -> Any:
        return _Resolver(self).resolve(value)

    def properties(self, logical_id: str) -> dict[str, Any]:
        resolved = self.resolve(self.resources[logical_id].get("Properties", {}))
        return resolved if isinstance(resolved, dict) else {}

    def outputs(self) -> dict[str, Any]:
        return {
            name: self.resolve(output.get("Value"))
            for name, output in self.template.get("Outputs", {}).items()
            if output.get("Condition") is None or self.conditions[output["Condition"]]
        }

    def all_resources(self, prefix: str = "") -> dict[str, tuple[Stack, str]]:
        """Every resource of this stack and its nested stacks: "<App>/<LogicalId>" → (stack, logical id)."""
        found: dict[str, tuple[Stack, str]] = {}
        for logical_id in self.resources:
            found[prefix + logical_id] = (self, logical_id)
            if logical_id in self.nested:
                found |= self.nested[logical_id].all_resources(f"{prefix}{logical_id}/")
        return found


def parameter_values(data: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, str]:
    """Every parameter's value (given, else its default) as CloudFormation passes it: a string; checked
    against AllowedValues, MinValue/MaxValue and AllowedPattern as CloudFormation checks them."""
    declared: dict[str, Any] = data.get("Parameters") or {}
    unknown = set(given) - set(declared)
    if unknown:
        raise TemplateError(f"no such parameters: {sorted(unknown)}")
    values: dict[str, str] = {}
    for name, spec in declared.items():
        if name in given:
            value = _string(given[name])
        elif "Default" in spec:
            value = _string(spec["Default"])
        else:
            raise TemplateError(f"parameter {name} has no value and no default")
        allowed = spec.get("AllowedValues")
        if allowed is not None and value not in [_string(v) for v in allowed]:
            raise TemplateError(f"parameter {name}={value!r} is not one of {allowed}")
        if spec.get("Type") == "Number":
            number = float(value)
            if "MinValue" in spec and number < float(spec["MinValue"]):
                raise TemplateError(f"parameter {name}={value} is below its MinValue {spec['MinValue']}")
            if "MaxValue" in spec and number > float(spec["MaxValue"]):
                raise TemplateError(f"parameter {name}={value} is above its MaxValue {spec['MaxValue']}")
        pattern = spec.get("AllowedPattern")
        if pattern is not None and not re.fullmatch(pattern, value):
            raise TemplateError(f"parameter {name}={value!r} does not match {pattern}")
        values[name] = value
    return values


def _string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _typed(data: Mapping[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
    """Number parameters as numbers, as a template's defaults read: what the language extensions put in
    place of a Ref must still pass SAM's property types (an event source mapping's BatchSize is an int)."""
    declared = data.get("Parameters") or {}
    typed: dict[str, Any] = dict(values)
    for name, value in values.items():
        if declared.get(name, {}).get("Type") == "Number":
            number = float(value)
            typed[name] = int(number) if number.is_integer() and "." not in value else number
    return typed


def _check_rules(data: Mapping[str, Any], parameters: Mapping[str, str]) -> None:
    """The template's Rules, as CloudFormation checks them before it changes anything."""
    resolver = _Resolver(Stack({"Conditions": {}}, dict(parameters), {}))
    for name, rule in (data.get("Rules") or {}).items():
        if "RuleCondition" in rule and not resolver.truth(rule["RuleCondition"]):
            continue
        for assertion in rule.get("Assertions", []):
            if not resolver.truth(assertion["Assert"]):
                raise TemplateError(f"rule {name}: {assertion.get('AssertDescription', 'assertion failed')}")


def _evaluate_conditions(template: Mapping[str, Any], parameters: Mapping[str, str]) -> dict[str, bool]:
    definitions = template.get("Conditions") or {}
    stack = Stack(dict(template), dict(parameters), {})
    resolver = _Resolver(stack)
    return {name: resolver.condition(name) for name in definitions}


def _load(template: Path | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(template, Path):
        return load_yaml(template)
    return expand_language_extensions(copy.deepcopy(dict(template)))


def translate(
    parameters: Mapping[str, Any] | None = None, template: Path | Mapping[str, Any] = TEMPLATE_PATH
) -> Stack:
    """The stack CloudFormation builds from the template `sam deploy` sends, for these parameters.

    `template` is a path or a template's data (loops expanded or not), e.g. a modified copy."""
    data = _load(template)
    values = parameter_values(data, parameters or {})
    _check_rules(data, values)
    processed = sam_transform(language_extensions(data, _typed(data, values)), values)
    stack = Stack(processed, values, _evaluate_conditions(processed, values))
    nested: dict[str, Stack] = {}
    base = template.parent if isinstance(template, Path) else ROOT
    for logical_id, path in _nested_templates(data, base).items():
        if logical_id not in stack.resources:
            continue
        passed = stack.properties(logical_id).get("Parameters", {})
        if any(not isinstance(v, (str, int, float, bool)) for v in passed.values()):
            raise TemplateError(f"{logical_id}: parameters CloudFormation alone can resolve: {passed}")
        child = load_yaml(path)
        child_values = parameter_values(child, {k: _string(v) for k, v in passed.items()})
        _check_rules(child, child_values)
        nested[logical_id] = Stack(child, child_values, _evaluate_conditions(child, child_values))
    return Stack(processed, values, stack.conditions, nested)


# --- resolution for comparison ----------------------------------------------------------------------


class _Resolver:
    """Parameters, pseudo parameters, conditions and the functions of literals resolved; references to
    resources (Ref, Fn::GetAtt, `${Resource}` in Fn::Sub) kept as written."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.parameters = stack.parameters
        self.mappings = stack.template.get("Mappings") or {}
        self.definitions = stack.template.get("Conditions") or {}
        self._conditions: dict[str, bool] = dict(stack.conditions)

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            if name not in self.definitions:
                raise TemplateError(f"no condition {name}")
            self._conditions[name] = self.truth(self.definitions[name])
        return self._conditions[name]

    def truth(self, expression: Any) -> bool:
        value = self.resolve(expression)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise TemplateError(
            f"not a condition CloudFormation can evaluate before the stack exists: {expression!r}"
        )

    def _literal(self, name: str) -> Any:
        if name in self.parameters:
            return self.parameters[name]
        if name in PSEUDO_PARAMETERS:
            return PSEUDO_PARAMETERS[name]
        return None

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            items = [self.resolve(item) for item in value]
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            key, args = next(iter(value.items()))
            if key in _INTRINSICS:
                return self._function(key, args)
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not NO_VALUE}

    def _function(self, key: str, args: Any) -> Any:
        if key == "Ref":
            name = self.resolve(args)
            if name == "AWS::NoValue":
                return NO_VALUE
            literal = self._literal(name) if isinstance(name, str) else None
            return literal if literal is not None else {"Ref": name}
        if key == "Condition":
            return self.condition(args)
        if key == "Fn::If":
            name, if_true, if_false = args
            return self.resolve(if_true if self.condition(name) else if_false)
        if key == "Fn::Equals":
            left, right = (self.resolve(a) for a in args)
            if _is_intrinsic(left) or _is_intrinsic(right):
                raise TemplateError(f"Fn::Equals of a value CloudFormation knows only later: {args!r}")
            return _string(left) == _string(right)
        if key == "Fn::Not":
            return not self.truth(args[0])
        if key == "Fn::And":
            return all(self.truth(a) for a in args)
        if key == "Fn::Or":
            return any(self.truth(a) for a in args)
        if key == "Fn::GetAtt":
            target = args.split(".", 1) if isinstance(args, str) else [self.resolve(a) for a in args]
            return {"Fn::GetAtt": target}
        if key == "Fn::Sub":
            return self._sub(args)
        if key == "Fn::Join":
            delimiter, items = self.resolve(args[0]), self.resolve(args[1])
            if isinstance(items, list) and all(not isinstance(i, (dict, list)) for i in items):
                return str(delimiter).join(_string(i) for i in items)
            return {"Fn::Join": [delimiter, items]}
        if key == "Fn::Select":
            index, items = self.resolve(args[0]), self.resolve(args[1])
            if isinstance(items, list) and not isinstance(index, dict):
                return items[int(index)]
            return {"Fn::Select": [index, items]}
        if key == "Fn::Split":
            delimiter, text = self.resolve(args[0]), self.resolve(args[1])
            if isinstance(text, str):
                return text.split(delimiter)
            return {"Fn::Split": [delimiter, text]}
        if key == "Fn::FindInMap":
            names = [self.resolve(a) for a in args[:3]]
            if all(isinstance(n, str) for n in names):
                try:
                    return copy.deepcopy(self.mappings[names[0]][names[1]][names[2]])
                except KeyError:
                    if len(args) > 3 and isinstance(args[3], dict) and "DefaultValue" in args[3]:
                        return self.resolve(args[3]["DefaultValue"])
                    raise TemplateError(f"Fn::FindInMap finds nothing at {names}") from None
            return {"Fn::FindInMap": names}
        return {key: self.resolve(args)}  # Fn::Base64, Fn::GetAZs, Fn::Cidr, ...: known at deploy time

    def _sub(self, args: Any) -> Any:
        text, variables = (args, {}) if isinstance(args, str) else (args[0], args[1])
        resolved = {name: self.resolve(v) for name, v in variables.items()}
        kept: dict[str, Any] = {}

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return match.group(0)
            found = resolved[name] if name in resolved else self._literal(name)
            if found is None or isinstance(found, (dict, list)):
                if name in resolved:
                    kept[name] = found
                return match.group(0)
            return _string(found)

        text = _PLACEHOLDER.sub(substitute, text)
        if all(m.group(1).startswith("!") for m in _PLACEHOLDER.finditer(text)):
            return _PLACEHOLDER.sub(lambda m: "${" + m.group(1)[1:] + "}", text)
        return {"Fn::Sub": [text, kept] if kept else text}


# --- comparison -------------------------------------------------------------------------------------


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
    def modified(self) -> set[str]:
        return self.of("modify")

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
    return value if value is None else _string(value)


def _differences(before: Any, after: Any, path: str = "") -> Iterator[str]:
    if isinstance(before, dict) and isinstance(after, dict) and not _is_intrinsic(before):
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
        for match in _PLACEHOLDER.finditer(text):
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
            changes[key] = Change("remove", stack.resources[logical_id]["Type"])
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
