"""The vocabulary of CloudFormation's intrinsic functions that translate.py's three parts share.

Which one-key mappings are intrinsic functions (INTRINSICS, is_intrinsic), the `${...}` placeholders of
an Fn::Sub (PLACEHOLDER), AWS::NoValue while a value is being resolved (NO_VALUE) and a scalar as
CloudFormation passes it on, a string (cfn_string): used by the transforms (transforms.py), the stack's
resolution (translate.py) and the comparison of two stacks (comparison.py). Also a fragment as deployed
under given conditions' values (chosen), for the tools and tests that read Fn::If the resolver leaves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE: Any = _NoValue()
PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


INTRINSICS = frozenset(
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


def is_intrinsic(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in INTRINSICS


def cfn_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_DROPPED = object()  # AWS::NoValue, while Fn::If is chosen


def chosen(conditions: Mapping[str, bool], value: Any) -> Any:
    """A fragment as CloudFormation deploys it under these conditions' values: each Fn::If replaced by the
    branch its condition picks, AWS::NoValue dropped; Ref, GetAtt and Sub stay as written."""
    if isinstance(value, list):
        return [item for item in (chosen(conditions, v) for v in value) if item is not _DROPPED]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Fn::If"}:
        condition, if_true, if_false = value["Fn::If"]
        return chosen(conditions, if_true if conditions[condition] else if_false)
    if value == {"Ref": "AWS::NoValue"}:
        return _DROPPED
    entries = {k: chosen(conditions, v) for k, v in value.items()}
    return {k: v for k, v in entries.items() if v is not _DROPPED}
