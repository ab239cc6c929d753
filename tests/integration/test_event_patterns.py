"""The FilterCriteria matcher of the local stack (EventBridge pattern syntax), on Lambda-shaped records.

AWS's own answers (210 recorded cases) are checked by tests/conformance/test_event_patterns.py; the cases
here pin the project's filter shapes on an outbox record, a few matcher rules that no recorded AWS answer
covers (each names its source), and that a pattern AWS rejects stops the local stack at template reading.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from tools.local.pollers.event_sources import read_event_sources
from tools.local.pollers.patterns import PatternError, matches, parse_pattern
from tools.template import Template, TemplateError

OUTBOX_INSERT: dict[str, Any] = {
    "eventName": "INSERT",
    "eventSource": "aws:dynamodb",
    "dynamodb": {
        "ApproximateCreationDateTime": 1795305540,
        "Keys": {"PK": {"S": "ORDER#o-1"}, "SK": {"S": "OUTBOX#000000000001#e-1"}},
        "NewImage": {
            "PK": {"S": "ORDER#o-1"},
            "SK": {"S": "OUTBOX#000000000001#e-1"},
            "eventType": {"S": "OrderCreated"},
            "sequence": {"N": "1"},
        },
        "SizeBytes": 120,
    },
    "tags": ["a", "b"],
}


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ('{"dynamodb": {"NewImage": {"SK": {"S": [{"prefix": "OUTBOX#"}]}}}}', True),
        ('{"dynamodb": {"NewImage": {"SK": {"S": [{"prefix": "ORDER"}]}}}}', False),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": ["OrderCreated", "OrderCancelled"]}}}}', True),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": ["OrderCancelled"]}}}}', False),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": [{"anything-but": ["OrderCancelled"]}]}}}}', True),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": [{"anything-but": {"prefix": "Order"}}]}}}}', False),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": [{"suffix": "Created"}]}}}}', True),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": [{"equals-ignore-case": "ordercreated"}]}}}}', True),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": [{"wildcard": "Order*d"}]}}}}', True),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": [{"wildcard": "Order?reated"}]}}}}', False),
        ('{"dynamodb": {"OldImage": [{"exists": false}]}}', True),
        ('{"dynamodb": {"OldImage": [{"exists": true}]}}', False),
        # exists applies to leaves: a typed attribute is an object, so the pattern must name its type key
        # (AWS's answers: conformance cases eb-exists_dynamodb_NEG, lambda-ddb-exists-filter-type-1).
        ('{"dynamodb": {"NewImage": {"eventType": [{"exists": true}]}}}', False),
        ('{"dynamodb": {"NewImage": {"eventType": {"S": [{"exists": true}]}}}}', True),
        ('{"dynamodb": {"NewImage": {"eventType": [{"exists": false}]}}}', True),
        ('{"dynamodb": {"SizeBytes": [{"numeric": [">", 100, "<=", 200]}]}}', True),
        ('{"dynamodb": {"SizeBytes": [{"numeric": ["<", 100]}]}}', False),
        ('{"dynamodb": {"ApproximateCreationDateTime": [1795305540.0]}}', True),
        # DynamoDB numbers are strings: numeric conditions do not apply to them, as in the cloud.
        ('{"dynamodb": {"NewImage": {"sequence": {"N": [{"numeric": [">", 0]}]}}}}', False),
        ('{"dynamodb": {"NewImage": {"sequence": {"N": ["1"]}}}}', True),
        ('{"tags": ["b"]}', True),
        ('{"tags": ["c"]}', False),
        ('{"$or": [{"eventName": ["REMOVE"]}, {"eventSource": ["aws:dynamodb"]}]}', True),
        ('{"$or": [{"eventName": ["REMOVE"]}, {"eventSource": ["aws:sqs"]}]}', False),
        ('{"eventName": ["INSERT"], "dynamodb": {"Keys": {"PK": {"S": ["ORDER#o-2"]}}}}', False),
    ],
)
def test_pattern_matching(pattern: str, expected: bool) -> None:
    assert matches(parse_pattern(pattern), OUTBOX_INSERT) is expected


def test_a_remove_record_without_new_image_does_not_match_a_new_image_pattern() -> None:
    removal = {"eventName": "REMOVE", "dynamodb": {"Keys": {"PK": {"S": "ORDER#o-1"}}}}
    pattern = parse_pattern('{"dynamodb": {"NewImage": {"SK": {"S": [{"prefix": "OUTBOX#"}]}}}}')

    assert not matches(pattern, removal)


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        "not json",
        '{"a": "scalar"}',
        '{"a": [{"prefix": "x", "suffix": "y"}]}',
        '{"$or": {"a": [1]}}',
    ],
)
def test_invalid_patterns_are_rejected_when_the_template_is_read(text: str) -> None:
    with pytest.raises(PatternError):
        parse_pattern(text)


# Rules of AWS's matcher (aws/event-ruler, whose reasons EventBridge returns verbatim) that no recorded
# AWS answer covers: JSON true is not the number 1, and a CIDR with host bits set is accepted.
@pytest.mark.parametrize(
    ("pattern", "event", "expected"),
    [
        ('{"flag": [1]}', {"flag": True}, False),  # JsonRuleCompiler.writeRules: true and 1 differ
        ('{"flag": [true]}', {"flag": 1}, False),
        ('{"flag": [true]}', {"flag": True}, True),
        ('{"n": [{"numeric": [">", 0]}]}', {"n": True}, False),  # numeric ranges: JSON numbers only
        ('{"n": [{"anything-but": [1]}]}', {"n": True}, True),  # ByteMachine: excluded only if same type
        ('{"n": [{"anything-but": [1]}]}', {"n": 1.0}, False),
        ('{"ip": [{"cidr": "10.0.0.5/24"}]}', {"ip": "10.0.0.200"}, True),  # CIDR.cidr: from 10.0.0.5 up
        ('{"ip": [{"cidr": "10.0.0.5/24"}]}', {"ip": "10.0.0.4"}, False),
        ('{"ip": [{"cidr": "10.0.0.0/24"}]}', {"ip": "2001:db8::1"}, False),
    ],
)
def test_values_are_compared_as_json_values(pattern: str, event: dict[str, Any], expected: bool) -> None:
    assert matches(parse_pattern(pattern), event) is expected


@pytest.mark.parametrize(
    "created",
    [datetime.datetime.fromtimestamp(1795305540, tz=datetime.UTC), "1795305540.0"],
    ids=["datetime", "string"],
)
def test_approximate_creation_date_time_is_filtered_as_a_number(created: Any) -> None:
    # Lambda converts it to a number before filtering (conformance cases lambda-ddb-date-time-conversion-*).
    dynamodb = {**OUTBOX_INSERT["dynamodb"], "ApproximateCreationDateTime": created}
    record = {**OUTBOX_INSERT, "dynamodb": dynamodb}
    pattern = parse_pattern('{"dynamodb": {"ApproximateCreationDateTime": [{"numeric": [">", 0]}]}}')

    assert matches(pattern, record)


def test_a_pattern_aws_rejects_stops_the_stack_when_the_template_is_read() -> None:
    data = copy.deepcopy(Template.load().data)
    events = data["Resources"]["OutboxRelayFunction"]["Properties"]["Events"]
    events["OrdersOutbox"]["Properties"]["FilterCriteria"]["Filters"] = [
        {"Pattern": '{"dynamodb": {"NewImage": {"SK": {"S": [{"prefix": ["OUTBOX#"]}]}}}}'}
    ]

    with pytest.raises(TemplateError, match="Reason: prefix match pattern must be a string"):
        read_event_sources(Template(data))


def test_the_template_filters_are_valid() -> None:
    sources = read_event_sources(Template.load())
    filters = [f for s in sources.streams for f in s.filters] + [f for q in sources.queues for f in q.filters]

    assert filters, "template.yaml has FilterCriteria"
