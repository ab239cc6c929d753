"""The two transforms CloudFormation runs on the template `sam deploy` sends, with the stack's parameters.

1. **AWS::LanguageExtensions** (`language_extensions`): SAM CLI's implementation
   (`samcli.lib.cfn_language_extensions`), the whole pipeline with the parameter values, as the transform
   has them: Fn::ForEach expanded, Fn::If on conditions of parameters resolved, Refs to parameters and the
   pseudo parameters a transform is given (Region, AccountId; the Partition and URL suffix derived from
   them) replaced by their values, in Resources, Conditions and Outputs (Globals is not a section the
   transform processes). Two of SAM CLI's resolvers flatten what they cannot resolve into plain strings (a
   partial Fn::Sub loses its `Fn::Sub` and keeps `${OrdersApi}` as text; an Fn::Join of a resource
   reference joins its Python repr): here they keep the intrinsic instead, with what could be substituted
   substituted.
2. **AWS::Serverless-2016-10-31** (`sam_transform`): samtranslator's `transform`, as CloudFormation runs
   it after the language extensions, with the code where `sam package` puts it (an S3 object per code
   directory, the same for every parameter value) and no managed policy (the template attaches none).

`nested_templates` names the nested applications whose template is a file of this repository; translate.py
reads them with the parameters the parent passes.
"""

from __future__ import annotations

import copy
import hashlib
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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

from tools.template.intrinsics import PLACEHOLDER, is_intrinsic
from tools.template.reader import ACCOUNT, PSEUDO_PARAMETERS, REGION, TemplateError

ARTIFACTS = "s3://sam-artifacts"


# --- 1. AWS::LanguageExtensions ---------------------------------------------------------------------


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
            if found is None or is_intrinsic(found) or isinstance(found, (dict, list)):
                if name in resolved:
                    kept[name] = resolved[name]
                return match.group(0)
            return str(self._value_to_string(found))

        text = PLACEHOLDER.sub(substitute, template_string)
        if not any(not m.group(1).startswith("!") for m in PLACEHOLDER.finditer(text)):
            return PLACEHOLDER.sub(lambda m: "${" + m.group(1)[1:] + "}", text)
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


def nested_templates(data: Mapping[str, Any], base: Path) -> dict[str, Path]:
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
