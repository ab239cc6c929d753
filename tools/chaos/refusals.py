"""An event bus that refuses chosen events for what they are, as EventBridge does (`MalformedDetail`).

moto accepts every PutEvents entry whose Detail is JSON, and the relay only sends such entries, so a
refusal by the bus cannot come from the emulator: this module injects it at the seam tools/chaos/faults.py
uses (botocore's BaseClient._make_api_call, and the awscrt transport's put_events and begin), for
PutEvents only; every other entry and call goes through.
It is loaded into a function worker through LOCAL_WORKER_PRELOAD, or runs an operator command:

    python -m tools.chaos.refusals redrive-poison ...     # = python -m operations redrive-poison ...

The event ids to refuse are read from the file named by CHAOS_REFUSALS_FILE (one per line) at every call,
so a scenario "fixes the cause" by emptying it. Without that variable nothing is wrapped.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
from pathlib import Path
from typing import Any

from botocore.client import BaseClient

from tools.chaos.injection import ApiCall, wrap_crt_put_events

REFUSALS_ENV = "CHAOS_REFUSALS_FILE"
REFUSAL = {"ErrorCode": "MalformedDetail", "ErrorMessage": "Detail is malformed. (tools.chaos.refusals)"}


def refused_ids(path: Path) -> set[str]:
    return set(path.read_text().split()) if path.exists() else set()


def _event_id(entry: dict[str, Any]) -> str | None:
    try:
        detail = json.loads(entry.get("Detail", ""))
    except ValueError:
        return None
    return detail.get("id") if isinstance(detail, dict) else None


def install(environ: dict[str, str] | None = None) -> bool:
    """Wrap PutEvents when CHAOS_REFUSALS_FILE is set; whether it was."""
    env = dict(os.environ) if environ is None else environ
    if not env.get(REFUSALS_ENV):
        return False
    path = Path(env[REFUSALS_ENV])
    original = getattr(BaseClient, "_make_api_call")  # noqa: B009 - a private method, on purpose

    def refusing(send: ApiCall, client: Any, operation: str, params: dict[str, Any]) -> Any:
        refuse = refused_ids(path) if operation == "PutEvents" else set()
        entries: list[dict[str, Any]] = list(params.get("Entries", []))
        refused = [_event_id(entry) in refuse for entry in entries]
        if not any(refused):
            return send(client, operation, params)
        results: list[dict[str, Any]] = [dict(REFUSAL) if r else {} for r in refused]
        forward = [position for position, r in enumerate(refused) if not r]
        if forward:
            sent = send(client, operation, {**params, "Entries": [entries[p] for p in forward]})
            for position, outcome in zip(forward, sent["Entries"], strict=True):
                results[position] = outcome
        return {"FailedEntryCount": sum("ErrorCode" in r for r in results), "Entries": results}

    @functools.wraps(original)
    def make_api_call(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        return refusing(original, client, operation, params)

    setattr(BaseClient, "_make_api_call", make_api_call)  # noqa: B010 - the seam, on purpose
    wrap_crt_put_events(refusing)  # the PostgreSQL publisher's PutEvents over awscrt
    return True


install()

if __name__ == "__main__":
    # Exactly `python -m operations ...` (its __main__ puts the shared layer on the path), with PutEvents
    # wrapped above.
    runpy.run_module("operations", run_name="__main__", alter_sys=True)
