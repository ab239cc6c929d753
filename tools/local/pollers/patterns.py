"""Event patterns (EventBridge syntax), as Lambda FilterCriteria apply them to records.

`parse_pattern` accepts exactly the patterns AWS accepts and rejects the others when the template is read,
with AWS's reason ("Event pattern is not valid. Reason: ..."). `matches` answers whether a record matches.

Matching is moto's EventBridge matcher (`moto.events.models.EventPattern`; moto is pinned in
requirements-dev.txt), mended where it and AWS disagree: each mend below says what AWS does and where that
is recorded. Validation is this module's own, since moto's (`EventPatternParser`) only checks that values
are objects or non-empty arrays. AWS's reasons are those of aws/event-ruler, the matcher EventBridge answers
with (its messages come back verbatim from TestEventPattern): JsonRuleCompiler.java, CIDR.java and
input/WildcardParser.java at https://github.com/aws/event-ruler. Lambda's CreateEventSourceMapping rejects
the same patterns without a reason ("Invalid filter pattern definition.").

AWS's recorded answers are tests/conformance/event_patterns.json ("the table" below), which
tests/conformance/test_event_patterns.py runs case by case.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from moto.events.models import UNDEFINED, EventPattern

_REASON = "Event pattern is not valid. Reason: "
_NUMERIC_OPERATORS = frozenset({"=", "<", "<=", ">", ">="})
_ANYTHING_BUT_OPERATORS = frozenset({"equals-ignore-case", "prefix", "suffix", "wildcard"})
# event-ruler's Constants.IPv4_REGEX / IPv6_REGEX: what may be an IP address literal at all.
_IPV4_LITERAL = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_IPV6_LITERAL = re.compile(r"[0-9a-fA-F:]*:[0-9a-fA-F:]*")
# AWS's wildcard complexity limit is not published. The one recorded rejection ("Rule is too complex",
# table case eb-content_wildcard_complex_EXC) has six wildcards; every accepted wildcard in the table has
# at most two. Reject above five: an approximation of AWS's rule, not its definition.
_MAX_WILDCARDS = 5


class PatternError(ValueError):
    """A filter pattern AWS rejects; the message gives AWS's reason."""


def parse_pattern(text: str) -> dict[str, Any]:
    """The pattern, once it is valid event pattern syntax as AWS checks it; PatternError otherwise."""
    try:
        pattern = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:  # json.JSONDecodeError included
        raise PatternError(f"{_REASON}not valid JSON: {exc}") from exc
    if not isinstance(pattern, dict):
        _reject("Filter is not an object")
    _check_object(pattern)
    return pattern


def matches(pattern: Mapping[str, Any], event: Any) -> bool:
    """Whether an event (a decoded JSON value, e.g. a Lambda record) matches a pattern from parse_pattern."""
    return bool(_AwsEventPattern(None, dict(pattern)).matches_event(_as_lambda_filters_it(event)))


# --- Matching: moto's matcher, mended -----------------------------------------------------------------


class _AwsEventPattern(EventPattern):
    """moto's EventPattern with the mends where AWS answers otherwise.

    moto flattens the event to {"a.b.c": value} and matches each pattern field against its value; here
    every flattened field holds the list of its leaf values (all of them: from arrays, from arrays of
    objects, and from a dotted key that names the same field as a nested path).
    """

    @staticmethod
    def _flatten_dict(node: Any, prefix: str = "", result: dict[str, Any] | None = None) -> dict[str, Any]:
        # Mend: moto keeps an array, or an empty object, as one value of its field. AWS matches fields to
        # leaf values: an array of objects is descended into (table: eb-list_within_dict, and
        # eb-dotted-pattern-key-into-array-of-objects), an empty array is no value at all, so `exists`
        # is false for it and [null] does not match it (eb-exists_list_empty_NEG,
        # eb-arrays_empty_null_NEG), and an object is never a leaf ("Exists matching only works on leaf
        # nodes", EventBridge content filtering docs; eb-exists_dynamodb_NEG).
        if result is None:
            result = {}
        if isinstance(node, dict):
            for key, value in node.items():
                _AwsEventPattern._flatten_dict(value, f"{prefix}.{key}" if prefix else key, result)
        elif isinstance(node, list):
            for element in node:
                _AwsEventPattern._flatten_dict(element, prefix, result)
        elif prefix:
            result.setdefault(prefix, []).append(node)
        return result

    def _does_item_match_filters(self, item: Any, filters: list[Any]) -> bool:
        # Mend: moto compares exact values with Python's ==, for which true == 1. AWS compares JSON
        # values: true and 1 are different values (event-ruler JsonRuleCompiler.writeRules; no recorded
        # AWS answer, pinned in tests/integration/test_event_patterns.py), while numbers match by value,
        # 300 matching 300.0 (eb-number_comparison_float).
        for condition in filters:
            if isinstance(condition, dict):
                if self._does_item_match_named_filter(item, condition):
                    return True
            elif item is not UNDEFINED and any(_same_value(condition, value) for value in item):
                return True
        return False

    @staticmethod
    def _does_item_match_named_filter(item: Any, pattern: dict[str, Any]) -> bool:
        ((name, argument),) = pattern.items()
        if name == "numeric" and item is not UNDEFINED:
            # Mend: moto takes true and false for the numbers 1 and 0 (a bool is an int in Python). AWS's
            # numeric matching applies to JSON numbers only (event-ruler ByteMachine.transitionOn; no
            # recorded answer for booleans; a string such as a DynamoDB N value never matches:
            # eb-numeric-string_NEG, lambda-ddb-numeric-filter-2).
            item = [value for value in item if _is_number(value)]
            return bool(item) and bool(EventPattern._does_item_match_named_filter(item, pattern))
        if name == "anything-but" and not isinstance(argument, dict):
            # Mend: moto excludes with Python's `in`, so [1] excludes true. AWS excludes a value only when
            # it is of the list's kind (numbers or strings) and equal (event-ruler ByteMachine: a failed
            # anything-but needs anythingBut.isNumeric() to agree with the value; no recorded answer for
            # booleans). As in moto, an absent field never matches and a null one does
            # (eb-content_anything_but_string_missing_NEG, eb-rule-anything-but-null-value).
            excluded = argument if isinstance(argument, list) else [argument]
            return item is not UNDEFINED and any(
                not any(_same_value(option, value) for option in excluded) for value in item
            )
        if name == "cidr":
            # Mend: moto parses the CIDR strictly, so one with host bits set (10.0.0.5/24), which AWS
            # accepts, never matches. AWS matches from the address written to the top of its block
            # (event-ruler CIDR.cidr; no recorded answer), and only IP address strings
            # (eb-content_ip_address_bad_type_NEG).
            version, low, high = _cidr_range(argument)
            return item is not UNDEFINED and any(_in_cidr(value, version, low, high) for value in item)
        return bool(EventPattern._does_item_match_named_filter(item, pattern))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same_value(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return isinstance(expected, bool) and isinstance(actual, bool) and expected == actual
    return bool(expected == actual)


def _in_cidr(value: Any, version: int, low: int, high: int) -> bool:
    if not isinstance(value, str) or not (_IPV4_LITERAL.fullmatch(value) or _IPV6_LITERAL.fullmatch(value)):
        return False
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return False
    return address.version == version and low <= int(address) <= high


def _as_lambda_filters_it(event: Any) -> Any:
    """The record as Lambda filters it: a DynamoDB record's ApproximateCreationDateTime is a number.

    AWS converts it to a number before filtering, so numeric conditions apply to it (table:
    lambda-ddb-date-time-conversion-*); a client such as boto3 may hand it over as a datetime.
    """
    dynamodb = event.get("dynamodb") if isinstance(event, dict) else None
    if not isinstance(dynamodb, dict):
        return event
    created = dynamodb.get("ApproximateCreationDateTime")
    if isinstance(created, datetime.datetime):
        number: Any = created.timestamp()
    elif isinstance(created, str):
        try:
            number = float(created)
        except ValueError:
            return event
    else:
        return event
    return {**event, "dynamodb": {**dynamodb, "ApproximateCreationDateTime": number}}


# --- Validation: AWS's rules and reasons (event-ruler's JsonRuleCompiler) --------------------------------


def _reject(reason: str) -> NoReturn:
    raise PatternError(_REASON + reason)


def _not_json(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not a JSON value")


def _token(value: Any) -> str:
    """How AWS's JSON parser names a value in a reason."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "{"
    if isinstance(value, list):
        return "["
    return json.dumps(value)


def _check_object(node: Mapping[str, Any]) -> None:
    if not node:
        _reject("Empty objects are not allowed")
    for key, value in node.items():
        if key == "$or":
            _check_or(value)
        elif isinstance(value, dict):
            _check_object(value)
        elif isinstance(value, list):
            _check_values(value)
        else:
            _reject(f'"{key}" must be an object or an array')


def _check_or(alternatives: Any) -> None:
    if not isinstance(alternatives, list):
        _reject("It must be an Array followed with $or.")
    for alternative in alternatives:
        if not isinstance(alternative, dict):
            _reject("Only JSON object is allowed in array of $or relationship.")
        _check_object(alternative)
    if len(alternatives) < 2:
        _reject("There must have at least 2 Objects in $or relationship.")


def _check_values(values: list[Any]) -> None:
    for value in values:
        if isinstance(value, dict):
            _check_condition(value)
        elif isinstance(value, list):
            _reject("Match value must be String, number, true, false, or null")
    if not values:
        _reject("Empty arrays are not allowed")


def _check_condition(condition: Mapping[str, Any]) -> None:
    if not condition:
        _reject("Match expression name not found")
    name, argument = next(iter(condition.items()))
    check = _OPERATORS.get(name)
    if check is None:
        # Operator names are case-sensitive: {"EXISTS": true} is rejected (eb-operator_case_sensitive_EXC).
        _reject(f"Unrecognized match type {name}")
    check(argument)
    if len(condition) > 1:
        if name in {"numeric", "anything-but"}:
            _reject("Too many elements in numeric expression")
        _reject("Only one key allowed in match expression")


def _check_prefix(argument: Any) -> None:
    _check_prefix_or_suffix("prefix", argument)


def _check_suffix(argument: Any) -> None:
    _check_prefix_or_suffix("suffix", argument)


def _check_prefix_or_suffix(name: str, argument: Any) -> None:
    if isinstance(argument, dict):
        if not argument:
            _reject(f"{name.capitalize()} expression name not found")
        inner, value = next(iter(argument.items()))
        if inner != "equals-ignore-case":
            _reject(f"Unsupported {name} pattern: {inner}")
        if not isinstance(value, str):
            _reject("equals-ignore-case match pattern must be a string")
        if len(argument) > 1:
            _reject("Only one key allowed in match expression")
    elif not isinstance(argument, str):
        # An empty prefix is valid and matches every string (eb-content_prefix_empty).
        _reject(f"{name} match pattern must be a string")


def _check_equals_ignore_case(argument: Any) -> None:
    if not isinstance(argument, str):
        _reject("equals-ignore-case match pattern must be a string")


def _check_exists(argument: Any) -> None:
    if not isinstance(argument, bool):
        _reject("exists match pattern must be either true or false.")


def _check_wildcard(argument: Any) -> None:
    if not isinstance(argument, str):
        _reject("wildcard match pattern must be a string")
    _check_wildcard_text(argument)


def _check_wildcard_text(text: str) -> None:
    # AWS reads the value with its quotes, so positions count the opening quote.
    data = f'"{text}"'.encode()
    wildcards = 0
    position = 0
    while position < len(data):
        byte = data[position : position + 1]
        if byte == b"*":
            if data[position + 1 : position + 2] == b"*":
                _reject(f"Consecutive wildcard characters at pos {position}")
            wildcards += 1
        elif byte == b"\\":
            if data[position + 1 : position + 2] not in {b"*", b"\\"}:
                _reject(f"Invalid escape character at pos {position}")
            position += 1
        position += 1
    if wildcards > _MAX_WILDCARDS:
        _reject(
            "Rule is too complex - try using fewer wildcard characters or fewer repeating character "
            "sequences after a wildcard character"
        )


def _check_numeric(argument: Any) -> None:
    if not isinstance(argument, list):
        _reject("Value of numeric must be an array.")
    terms = list(argument)

    def term(index: int) -> Any:
        return terms[index] if index < len(terms) else UNDEFINED

    def named(index: int) -> str:
        return _token(terms[index]) if index < len(terms) else "]"

    operator = term(0)
    if not isinstance(operator, str):
        _reject(f"Invalid member in numeric match: {named(0)}")
    if operator not in _NUMERIC_OPERATORS:
        _reject(f"Unrecognized numeric range operator: {operator}")
    if not _is_number(term(1)):
        _reject(f"Value of {'equals' if operator == '=' else operator} must be numeric")
    if len(terms) == 2:
        return
    if operator in {"=", "<", "<="}:
        _reject("Too many elements in numeric expression")
    top_operator = term(2)
    if not isinstance(top_operator, str):
        _reject(f"Bad value in numeric range: {named(2)}")
    if top_operator not in {"<", "<="}:
        _reject(f"Bad numeric range operator: {top_operator}")
    if not _is_number(term(3)):
        _reject(f"Value of {top_operator} must be numeric")
    if len(terms) > 4:
        _reject("Too many terms in numeric range expression")
    if not terms[1] < terms[3]:
        _reject("Bottom must be less than top")


def _check_anything_but(argument: Any) -> None:
    operator = None
    extra_keys = False
    if isinstance(argument, dict):
        if not argument:
            _reject("Anything-But expression name not found")
        extra_keys = len(argument) > 1
        operator, argument = next(iter(argument.items()))
        if operator not in _ANYTHING_BUT_OPERATORS:
            _reject(f"Unsupported anything-but pattern: {operator}")
    if not (isinstance(argument, list | str) or _is_number(argument)):
        # null, true, false, or an object (e.g. {"prefix": {"equals-ignore-case": ...}}).
        _reject("Value of anything-but must be an array or single string/number value.")
    values = argument if isinstance(argument, list) else [argument]
    if operator is None:
        if not all(isinstance(value, str) or _is_number(value) for value in values):
            _reject("Inside anything but list, start|null|boolean is not supported.")
        if isinstance(argument, list) and len({isinstance(value, str) for value in values}) != 1:
            _reject(
                "Inside anything but list, either all values are number or string, "
                "mixed type is not supported"
            )
        return
    for value in values:
        if not isinstance(value, str):
            if operator == "equals-ignore-case":
                _reject(
                    "Inside anything-but/equals-ignore-case list, number|start|null|boolean is not supported."
                )
            if operator == "wildcard":
                _reject("wildcard match pattern must be a string")
            _reject("prefix/suffix match pattern must be a string")
        if operator in {"prefix", "suffix"} and not value:
            _reject("Null prefix/suffix not allowed")
        if operator == "wildcard":
            _check_wildcard_text(value)
    if extra_keys:
        _reject("Too many elements in numeric expression")


def _check_cidr(argument: Any) -> None:
    if not isinstance(argument, str):
        # AWS's own (odd) reason for a cidr that is not a string (eb-content_ip_address_type_EXC).
        _reject("prefix match pattern must be a string")
    _cidr_range(argument)


def _cidr_range(text: str) -> tuple[int, int, int]:
    """(IP version, lowest, highest address) of a cidr condition, as event-ruler's CIDR.cidr reads it."""
    parts = text.split("/")
    while parts and not parts[-1]:
        parts.pop()  # Java's String.split drops trailing empty strings
    if len(parts) != 2:
        _reject("Malformed CIDR, one '/' required")
    literal, mask_text = parts
    if not re.fullmatch(r"[+-]?[0-9]+", mask_text):
        _reject("Malformed CIDR, mask bits must be an integer")
    mask = int(mask_text)
    if mask < 0:
        _reject("Malformed CIDR, mask bits must not be negative")
    if not (_IPV4_LITERAL.fullmatch(literal) or _IPV6_LITERAL.fullmatch(literal)):
        _reject(f"Nonstandard IP address: {literal}")
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        _reject(f"Invalid IP address: {literal}")
    if address.version == 4 and mask > 31:
        _reject("IPv4 mask bits must be < 32")
    if address.version == 6 and mask > 127:
        _reject("IPv6 mask bits must be < 128")
    low = int(address)
    return address.version, low, low | ((1 << (address.max_prefixlen - mask)) - 1)


_OPERATORS: dict[str, Callable[[Any], None]] = {
    "prefix": _check_prefix,
    "suffix": _check_suffix,
    "equals-ignore-case": _check_equals_ignore_case,
    "anything-but": _check_anything_but,
    "numeric": _check_numeric,
    "exists": _check_exists,
    "cidr": _check_cidr,
    "wildcard": _check_wildcard,
}
