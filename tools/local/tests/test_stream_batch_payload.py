"""A stream batch stays within Lambda's 6 MB synchronous payload: AWS's stream mapping sends "batches ... up
to the payload limit for synchronous invocation (6 MB)" (EventSourceMappingConfiguration, BatchSize:
https://docs.aws.amazon.com/lambda/latest/api/API_EventSourceMappingConfiguration.html). The relay's
mapping reads 100 records a batch: with outbox items near DynamoDB's 400 KB, AWS sends far fewer."""

from __future__ import annotations

import json

from tools.local.pollers.stream_lanes import Pending
from tools.local.pollers.stream_poller import records_within_payload
from tools.local.runtime.functions import SYNC_PAYLOAD_LIMIT


def pending(n: int, padding: int) -> Pending:
    record = {"eventID": str(n), "dynamodb": {"NewImage": {"envelope": {"S": "x" * padding}}}}
    return Pending(record=record, sequence_number=str(n), created_at=0.0, arrived_at=0.0, seen_monotonic=0.0)


def test_a_batch_of_small_records_is_kept_whole() -> None:
    batch = [pending(n, 1_000) for n in range(100)]
    assert records_within_payload(batch) == 100


def test_a_batch_of_large_records_is_cut_at_six_mb_with_its_event_within_it() -> None:
    batch = [pending(n, 390_000) for n in range(100)]

    fits = records_within_payload(batch)

    event = json.dumps({"Records": [p.record for p in batch[:fits]]}).encode()
    one_more = json.dumps({"Records": [p.record for p in batch[: fits + 1]]}).encode()
    assert fits == 16
    assert len(event) <= SYNC_PAYLOAD_LIMIT < len(one_more)


def test_a_single_record_always_goes_out() -> None:
    assert records_within_payload([pending(0, SYNC_PAYLOAD_LIMIT)]) == 1
