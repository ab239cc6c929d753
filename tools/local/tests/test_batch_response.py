"""A partial batch response read as Lambda documents it for SQS and DynamoDB Streams (the conditions are
quoted in tools/local/pollers/batch_response.py), and the queue poller's verdict on a batch from it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tools.local.pollers.batch_response import InvalidBatchResponse, reported_identifiers
from tools.local.pollers.queue_poller import QueuePoller
from tools.local.runtime.functions import InvocationResult

BATCH = [{"messageId": "m-1"}, {"messageId": "m-2"}]


@pytest.mark.parametrize("payload", [None, {}, {"batchItemFailures": []}, {"batchItemFailures": None}])
def test_an_empty_or_null_response_or_list_is_a_complete_success(payload: Any) -> None:
    assert reported_identifiers(payload) == []


@pytest.mark.parametrize(
    "payload",
    [
        "ok",
        42,
        ["m-1"],
        {"batchItemFailures": {}},
        {"batchItemFailures": "m-1"},
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": [{"itemIdentifier": None}]},
        {"batchItemFailures": [{"itemId": "m-1"}]},
        {"batchItemFailures": ["m-1"]},
    ],
)
def test_a_response_not_of_the_documented_shape_is_a_complete_failure(payload: Any) -> None:
    with pytest.raises(InvalidBatchResponse):
        reported_identifiers(payload)


def failed_ids(payload: Any) -> set[str]:
    poller = SimpleNamespace(source=SimpleNamespace(report_batch_item_failures=True))
    result = InvocationResult("req-1", payload=payload)
    return QueuePoller._failed_ids(poller, result, BATCH)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("payload", "kept"),
    [
        (None, set()),
        ({"batchItemFailures": [{"itemIdentifier": "m-2"}]}, {"m-2"}),
        ({"batchItemFailures": [{"itemIdentifier": "m-9"}]}, {"m-1", "m-2"}),  # not in the batch
        ("ok", {"m-1", "m-2"}),  # was: both deleted after one delivery
        ({"batchItemFailures": {}}, {"m-1", "m-2"}),  # was: both deleted
    ],
)
def test_the_queue_poller_keeps_what_the_response_reports_and_everything_when_it_is_invalid(
    payload: Any, kept: set[str]
) -> None:
    assert failed_ids(payload) == kept
