"""Event patterns (EventBridge syntax), as Lambda FilterCriteria apply them to records.

Supported: exact values (strings, numbers, booleans, null), prefix, suffix, equals-ignore-case,
wildcard, anything-but (values, prefix, suffix), exists, numeric ranges, and $or. Arrays in the
record match when any element matches. Numeric matching applies to JSON numbers only, as in the
cloud: DynamoDB "N" values are strings and do not match numeric conditions.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

_MISSING = object()
_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "=": operator.eq,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class PatternError(ValueError):
    """A filter pattern that is not valid event pattern syntax."""


def parse_pattern(text: str) -> dict[str, Any]:
    try:
        pattern = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PatternError(f"filter pattern is not JSON: {exc}") from exc
    if not isinstance(pattern, dict):
        raise PatternError("a filter pattern must be a JSON object")
    _validate(pattern)
    return pattern


def _validate(pattern: Mapping[str, Any]) -> None:
    for key, expected in pattern.items():
        if key == "$or":
            if not isinstance(expected, list) or not all(isinstance(p, dict) for p in expected):
                raise PatternError("$or takes a list of patterns")
            for alternative in expected:
                _validate(alternative)
        elif isinstance(expected, dict):
            _validate(expected)
        elif isinstance(expected, list):
            for condition in expected:
                if isinstance(condition, dict) and len(condition) != 1:
                    raise PatternError(
                        f"condition {condition!r} under {key!r} must have exactly one operator"
                    )
        else:
            raise PatternError(f"the value of {key!r} must be an object or a list of conditions")


def matches(pattern: Mapping[str, Any], event: Any) -> bool:
    """Whether an event (a decoded JSON value) matches a pattern."""
    for key, expected in pattern.items():
        if key == "$or":
            if not any(matches(alternative, event) for alternative in expected):
                return False
            continue
        value = event.get(key, _MISSING) if isinstance(event, dict) else _MISSING
        if isinstance(expected, dict):
            # A nested pattern over an absent object can still match through {"exists": false}.
            nested = {} if value is _MISSING else value
            if not isinstance(nested, dict) or not matches(expected, nested):
                return False
        elif not _leaf_matches(expected, value):
            return False
    return True


def _leaf_matches(conditions: list[Any], value: Any) -> bool:
    candidates = value if isinstance(value, list) else [value]
    for condition in conditions:
        if isinstance(condition, dict):
            ((name, argument),) = condition.items()
            if name == "exists":
                if (value is not _MISSING) == bool(argument):
                    return True
                continue
            if value is not _MISSING and any(_named_matches(name, argument, c) for c in candidates):
                return True
        elif value is not _MISSING and any(_equals(condition, c) for c in candidates):
            return True
    return False


def _equals(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if _is_number(expected) and _is_number(actual):
        return float(expected) == float(actual)
    return bool(expected == actual)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string_test(argument: Any, value: str, test: Callable[[str, str], bool]) -> bool:
    if isinstance(argument, dict) and "equals-ignore-case" in argument:
        return test(value.lower(), str(argument["equals-ignore-case"]).lower())
    if isinstance(argument, list):
        return any(test(value, str(option)) for option in argument)
    return test(value, str(argument))


def _named_matches(name: str, argument: Any, value: Any) -> bool:
    if name == "prefix":
        return isinstance(value, str) and _string_test(argument, value, str.startswith)
    if name == "suffix":
        return isinstance(value, str) and _string_test(argument, value, str.endswith)
    if name == "equals-ignore-case":
        options = argument if isinstance(argument, list) else [argument]
        return isinstance(value, str) and any(value.lower() == str(o).lower() for o in options)
    if name == "wildcard":
        return isinstance(value, str) and _wildcard(str(argument)).fullmatch(value) is not None
    if name == "anything-but":
        return not _anything_but_excludes(argument, value)
    if name == "numeric":
        return _is_number(value) and _numeric_matches(argument, float(value))
    raise PatternError(f"unsupported pattern operator {name!r}")


def _wildcard(pattern: str) -> re.Pattern[str]:
    # Only "*" is special in EventBridge wildcards.
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def _anything_but_excludes(argument: Any, value: Any) -> bool:
    if isinstance(argument, dict):
        ((name, inner),) = argument.items()
        return _named_matches(name, inner, value)
    options = argument if isinstance(argument, list) else [argument]
    return any(_equals(option, value) for option in options)


def _numeric_matches(argument: Any, value: float) -> bool:
    if not isinstance(argument, list) or len(argument) not in {2, 4}:
        raise PatternError(f"numeric takes [op, number] or [op, number, op, number], got {argument!r}")
    for position in range(0, len(argument), 2):
        op, bound = argument[position], argument[position + 1]
        if op not in _COMPARISONS or not _is_number(bound):
            raise PatternError(f"invalid numeric condition {op!r} {bound!r}")
        if not _COMPARISONS[op](value, float(bound)):
            return False
    return True
