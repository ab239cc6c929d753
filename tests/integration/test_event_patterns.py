"""The FilterCriteria matcher of the local stack (EventBridge pattern syntax), on Lambda-shaped records."""

from __future__ import annotations

from typing import Any

import pytest

from tools.local.patterns import PatternError, matches, parse_pattern

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
        ('{"dynamodb": {"NewImage": {"eventType": [{"exists": true}]}}}', True),
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
