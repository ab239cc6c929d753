"""Test-only handlers for the local stack's own tests: each record says how the handler behaves.

Stream records: NewImage.action is "ok" (default), "fail" (reported as a batch item failure every
time), "fail-once" (reported the first time only), "raise" (the invocation fails), "sleep" (outlives
the timeout). Queue messages: a body starting with "fail" is reported as a batch item failure.
An event without Records answers with what the function sees of its environment.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

_failed_once: set[str] = set()  # lives as long as the execution environment, as in Lambda


def _environment(context: Any) -> dict[str, Any]:
    return {
        "environment": dict(os.environ),
        "sys_path": list(sys.path),
        "cwd": os.getcwd(),
        "function_name": context.function_name,
        "remaining_ms": context.get_remaining_time_in_millis(),
    }


def stream_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    if "Records" not in event:
        return _environment(context)
    failures = []
    for record in event["Records"]:
        image = record["dynamodb"].get("NewImage") or {}
        action = image.get("action", {}).get("S", "ok")
        key = record["dynamodb"]["Keys"]["PK"]["S"]
        if action == "raise":
            raise RuntimeError(f"probe record {key} asked for a function error")
        if action == "sleep":
            time.sleep(float(image.get("seconds", {}).get("N", "5")))
        if action == "fail" or (action == "fail-once" and key not in _failed_once):
            _failed_once.add(key)
            failures.append({"itemIdentifier": record["dynamodb"]["SequenceNumber"]})
    return {"batchItemFailures": failures}


def queue_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    failures = [{"itemIdentifier": r["messageId"]} for r in event["Records"] if r["body"].startswith("fail")]
    return {"batchItemFailures": failures}
