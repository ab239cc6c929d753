"""template.yaml as CloudFormation sees it after `sam deploy`: the stack it builds for given parameters.

`translate(parameters)` checks the parameters and the template's Rules as CloudFormation does, runs the
two transforms CloudFormation runs on the template `sam deploy` sends (transforms.py), with the stack's
parameter values, and reads the nested application's own template with the parameters the parent passes
it (tools/template/README.md, "What CloudFormation sees"): an `AWS::Serverless::Application` with a
`Location` in this repository is the child template, parsed, with the `Parameters` the parent's translated
`AWS::CloudFormation::Stack` passes; CloudFormation compares its resources in the nested stack's own
update. A `Stack` resolves what CloudFormation can before it creates anything (Refs to parameters and
pseudo parameters, conditions, Fn::If, Fn::Sub, Fn::Join, Fn::Select, Fn::Split and Fn::FindInMap),
keeping references to resources as written: what comparison.py compares.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.template.intrinsics import INTRINSICS, NO_VALUE, PLACEHOLDER, cfn_string, is_intrinsic
from tools.template.reader import (
    PSEUDO_PARAMETERS,
    ROOT,
    TEMPLATE_PATH,
    TemplateError,
    expand_language_extensions,
    load_yaml,
)
from tools.template.transforms import language_extensions, nested_templates, sam_transform

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
            value = cfn_string(given[name])
        elif "Default" in spec:
            value = cfn_string(spec["Default"])
        else:
            raise TemplateError(f"parameter {name} has no value and no default")
        allowed = spec.get("AllowedValues")
        if allowed is not None and value not in [cfn_string(v) for v in allowed]:
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
    for logical_id, path in nested_templates(data, base).items():
        if logical_id not in stack.resources:
            continue
        passed = stack.properties(logical_id).get("Parameters", {})
        if any(not isinstance(v, (str, int, float, bool)) for v in passed.values()):
            raise TemplateError(f"{logical_id}: parameters CloudFormation alone can resolve: {passed}")
        child = load_yaml(path)
        child_values = parameter_values(child, {k: cfn_string(v) for k, v in passed.items()})
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
            if key in INTRINSICS:
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
            if is_intrinsic(left) or is_intrinsic(right):
                raise TemplateError(f"Fn::Equals of a value CloudFormation knows only later: {args!r}")
            return cfn_string(left) == cfn_string(right)
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
                return str(delimiter).join(cfn_string(i) for i in items)
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
            return cfn_string(found)

        text = PLACEHOLDER.sub(substitute, text)
        if all(m.group(1).startswith("!") for m in PLACEHOLDER.finditer(text)):
            return PLACEHOLDER.sub(lambda m: "${" + m.group(1)[1:] + "}", text)
        return {"Fn::Sub": [text, kept] if kept else text}
