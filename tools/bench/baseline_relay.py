"""The naive relay the common articles show, kept here only as the benchmark's baseline.

No FilterCriteria (every stream record invokes it), one PutEvents call per record, no partial batch
response (any failure fails, and so re-sends, the whole batch). Do not use this in production.
"""

from __future__ import annotations

import json
from typing import Any


def baseline_handler(event: dict[str, Any], events_client: Any, bus_name: str) -> None:
    for record in event["Records"]:
        image = record["dynamodb"].get("NewImage") or {}
        if record["eventName"] != "INSERT" or not image.get("SK", {}).get("S", "").startswith("OUTBOX#"):
            continue
        envelope = json.loads(image["envelope"]["S"])
        response = events_client.put_events(
            Entries=[
                {
                    "EventBusName": bus_name,
                    "Source": envelope["source"],
                    "DetailType": envelope["type"],
                    "Detail": image["envelope"]["S"],
                }
            ]
        )
        if response["FailedEntryCount"]:
            raise RuntimeError("publish failed; the whole batch will be retried")
