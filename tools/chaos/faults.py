"""Fault injection inside a function's worker process, loaded through LOCAL_WORKER_PRELOAD.

Configured by the CHAOS_PLAN environment variable (chaos.plan.Plan as JSON). It wraps botocore's
BaseClient._make_api_call, through which every AWS call of the function passes, and in consumers it
observes Powertools' batch processor to know which message is being handled. The function's code has
no branch for it: without CHAOS_PLAN (or for a function the plan does not name) nothing is wrapped.

Where faults go (per role of the function):
    api       TransactWriteItems: ThrottlingException or a TransactionConflict cancellation before the
              call; or the call commits and the worker then sleeps past the client's HTTP timeout; or a
              cancel decided on a PENDING order is held (a latency spike) until the order has moved on,
              then written: a stale write that the version condition must refuse.
    relay     PutEvents: ThrottlingException, an InternalException, a lost response (the call landed,
              then a read timeout), per-entry InternalFailure for some entries (once, or for every
              retry of the invocation so the relay checkpoints), or a crash after the call succeeded.
              The stream relay, and with OrderStore=postgres the polling publisher, whose crash after
              PutEvents is one before its COMMIT (the rows stay pending and are published again).
              With PostgresRelay=logical the publisher's crash after PutEvents is one before its slot
              advance (the slot decodes the round again); and its advance_slot
              (shop.runtime.logical_relay's name for it, wrapped once the handler imports the module):
              the slot advanced past outbox rows, then a crash before that transaction's COMMIT.
              With the relay operations (tools/chaos/relay_operations.py), the logical relay's replay
              sets (shop.adapters.postgres.replays' activate and mark_done): a crash after a set's
              activation (before COMMIT), after that COMMIT (before the slot passes the set's message),
              after a chunk of a set went out (before COMMIT); and the crashes the migration function
              arms (Arms) at a relay switch's steps: the next PutEvents goes through, then the process
              dies, after holding its round's locks a while when the step waits for them.
    migration the order database's migration function (shop.adapters.postgres.relay_mode's switch_relay,
              _prepare_slot and _drop_slot): at each step of a switch the harness asked for (SWITCH_FILE),
              it arms a crash of the publisher and, before a step that waits for the rounds in progress,
              waits until a publisher took it.
    consumer  the business write (TransactWriteItems on a business table) or, for the notifier, the
              SNS Publish: a crash before it, a timeout before it (an IN_PROGRESS idempotency record
              left by a dead consumer), a crash after it (before the idempotency record completes);
              and a crash after Powertools completed the record (before the message is deleted).

A crash raises ChaosCrash, a BaseException: nothing in the function catches it, the worker process
dies, and the event source redelivers. Decisions come from random.Random(seed|function|incarnation);
caps and "one fault per event id per function" are shared by the function's incarnations through a
state file under flock, and a consumer crash never brings any message of its batch closer than two
receives to the queue's maxReceiveCount, so the pipeline always converges. Every fault is a line in
the ledger.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from tools.chaos.ledger import Ledger
from tools.chaos.plan import (
    API,
    API_CONFLICT,
    API_KINDS,
    API_STALE_CANCEL,
    API_THROTTLE,
    CONSUMER,
    CONSUMER_CONFLICT,
    CONSUMER_TIMEOUT,
    CRASH_AFTER_COMPLETE,
    CRASH_AFTER_PUBLISH,
    CRASH_AFTER_WRITE,
    CRASH_BEFORE_WRITE,
    MIGRATION,
    NOTIFIER,
    OBSERVED_PUBLISH_RESPONSE_LOST,
    PLAN_ENV,
    POISON_OUTBOX_ITEM,
    RELAY,
    RELAY_CALL_ERROR,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
    RELAY_CRASH_BEFORE_PASSING_SET,
    RELAY_ENTRY_FAILURES,
    RELAY_ENTRY_FAILURES_PERSISTENT,
    RELAY_KINDS,
    RELAY_LOST_RESPONSE,
    RELAY_THROTTLE,
    SET_KINDS,
    SLOT_KINDS,
    FunctionPlan,
    Plan,
    seeded_rng,
)

ApiCall = Callable[[BaseClient, str, dict[str, Any]], Any]

# PostgresRelay=logical: the module whose `advance_slot` (and `peek_changes`) the relay's round calls.
LOGICAL_RELAY_MODULE = "shop.runtime.logical_relay"
_REPLICATION_MODULE = "shop.adapters.postgres.replication"
# The replay sets the logical relay drains (activate, mark_done: called through the module, so wrapped there).
REPLAYS_MODULE = "shop.adapters.postgres.replays"
# The migration function's relay switch (switch_relay calls its steps through the module's globals).
RELAY_MODE_MODULE = "shop.adapters.postgres.relay_mode"
# In the plan's state_dir: the switch the harness is about to ask the migration function for (its label,
# the relay it switches to, the function whose crashes to arm and how); absent, the hooks do nothing (the
# stack's own Create at start-up).
SWITCH_FILE = "switch.json"
_ARM_POLL_SECONDS = 0.05
# A poison row of the outbox, as the harness writes it (tools/chaos/postgres_store.poison_row's values).
INSERT_POISON_ROW = (
    "INSERT INTO outbox (event_id, aggregate_id, sequence, event_type, envelope)"
    " VALUES (%(event_id)s, %(aggregate_id)s, %(sequence)s, 'OrderCreated', %(envelope)s)"
)
# A switch's steps, where the migration function arms a publisher's crash: by the relay switched to, the
# first and the last (around the whole switch), and the one between its two parts.
POINTS = {
    "logical": ("before the slot's creation", "after the handover"),
    "polling": ("before the handover", "after the slot is dropped"),
}
BEFORE_HANDOVER_TO_LOGICAL = "after the slot's creation, before the handover"
BEFORE_SLOT_DROP = "after the handover, before the slot is dropped"
SWITCH_POINTS = {
    "logical": (POINTS["logical"][0], BEFORE_HANDOVER_TO_LOGICAL, POINTS["logical"][1]),
    "polling": (POINTS["polling"][0], BEFORE_SLOT_DROP, POINTS["polling"][1]),
}
# The publisher tries an entry at most 6 times per invocation; failing it that often makes it checkpoint.
_PERSISTENT_FAILURES = 6
_MAX_FAILED_ENTRIES = 3
# A stale cancel waits at most this long for the order to change under it.
_STALE_HOLD_SECONDS = 4.0
_STALE_POLL_SECONDS = 0.05


class ChaosCrash(BaseException):
    """The process dies here (a crash, an out-of-memory kill): not an Exception, so nothing catches it."""


def _client_error(code: str, message: str, operation: str, status: int = 400, **extra: Any) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": f"chaos: {message}"},
        "ResponseMetadata": {"HTTPStatusCode": status},
        **extra,
    }
    return ClientError(response, operation)  # type: ignore[arg-type]


@contextmanager
def _locked_json(path: Path, lock_path: Path, default: Callable[[], Any]) -> Iterator[Any]:
    """A JSON document shared by processes: read under an exclusive flock, written back on leaving."""
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            document = json.loads(path.read_text()) if path.exists() else default()
            yield document
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(document))
            temporary.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class FunctionState:
    """Counters and faulted ids of one function, shared by all its incarnations (a JSON file under flock)."""

    def __init__(self, directory: Path, function: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / f"{function}.json"
        self._lock_path = directory / f"{function}.lock"

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with _locked_json(
            self._path, self._lock_path, lambda: {"incarnations": 0, "counts": {}, "faulted": []}
        ) as state:
            yield state

    def new_incarnation(self) -> int:
        with self._locked() as state:
            state["incarnations"] += 1
            return int(state["incarnations"])

    def counts(self) -> dict[str, int]:
        with self._locked() as state:
            return dict(state["counts"])

    def tally(self, kind: str, cap: int) -> bool:
        """Count one fault of `kind` that marks no id (it may strike the same message again)."""
        with self._locked() as state:
            counts: dict[str, int] = state["counts"]
            if counts.get(kind, 0) >= cap:
                return False
            counts[kind] = counts.get(kind, 0) + 1
            return True

    def claim(self, kind: str, ids: list[str], cap: int) -> bool:
        """Reserve one fault of `kind` on `ids`: refused past the cap or if any id was faulted before."""
        with self._locked() as state:
            counts: dict[str, int] = state["counts"]
            faulted = set(state["faulted"])
            if counts.get(kind, 0) >= cap or faulted.intersection(ids):
                return False
            counts[kind] = counts.get(kind, 0) + 1
            state["faulted"].extend(ids)
            return True

    def release(self, kind: str, ids: list[str]) -> None:
        """Give back a fault claimed but never injected (the call it was to follow failed on its own)."""
        with self._locked() as state:
            state["counts"][kind] = max(0, state["counts"].get(kind, 0) - 1)
            state["faulted"] = [faulted for faulted in state["faulted"] if faulted not in set(ids)]


class Arms:
    """Crashes armed for one function by another process (the migration function, at a relay switch's
    steps), taken in the order they were armed by the function's next opportunity (its next PutEvents),
    each once. Every arm stays in the file, taken or withdrawn: the harness reports them all."""

    def __init__(self, directory: Path, function: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / f"{function}.arms.json"
        self._lock_path = directory / f"{function}.arms.lock"

    def _locked(self) -> Any:
        return _locked_json(self._path, self._lock_path, list)

    def arm(self, **details: Any) -> int:
        with self._locked() as arms:
            number = len(arms) + 1
            arms.append(
                {"arm": number, "armed_at": time.time(), "taken_at": None, "withdrawn": False, **details}
            )
            return number

    def take(self, **taker: Any) -> dict[str, Any] | None:
        """The first arm neither taken nor withdrawn, now taken (by `taker`); None when there is none."""
        with self._locked() as arms:
            for arm in arms:
                if arm["taken_at"] is None and not arm["withdrawn"]:
                    arm.update(taken_at=time.time(), taker=taker)
                    return dict(arm)
            return None

    def give_back(self, number: int) -> None:
        """A taken arm whose crash never happened (the call it was to follow failed on its own)."""
        with self._locked() as arms:
            for arm in arms:
                if arm["arm"] == number:
                    arm.update(taken_at=None, taker=None)

    def withdraw(self, number: int) -> bool:
        """No longer to be taken; False when it was taken already."""
        with self._locked() as arms:
            for arm in arms:
                if arm["arm"] == number and arm["taken_at"] is None:
                    arm["withdrawn"] = True
                    return True
            return False

    def taken(self, number: int) -> bool:
        with self._locked() as arms:
            return any(arm["arm"] == number and arm["taken_at"] is not None for arm in arms)

    def all(self) -> list[dict[str, Any]]:
        with self._locked() as arms:
            return [dict(arm) for arm in arms]


def write_switch(state_dir: Path, **switch: Any) -> None:
    """What the migration function's next relay switch arms (see SWITCH_FILE); `clear_switch` after it."""
    path = state_dir / SWITCH_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(switch))
    temporary.replace(path)


def clear_switch(state_dir: Path) -> None:
    (state_dir / SWITCH_FILE).unlink(missing_ok=True)


def _detail_id(body: Any) -> str | None:
    """The CloudEvent id of an SQS body holding an EventBridge event, None when malformed."""
    try:
        document = json.loads(body)
    except (TypeError, ValueError):
        return None
    detail = document.get("detail") if isinstance(document, dict) else None
    event_id = detail.get("id") if isinstance(detail, dict) else None
    return event_id if isinstance(event_id, str) else None


def _cancel_from_pending(params: dict[str, Any], puts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """For a cancel decided on a PENDING order (its event is sequence 2): the read of that order."""
    cancels = [i for i in puts if i.get("eventType", {}).get("S") == "OrderCancelled" and "sequence" in i]
    if len(cancels) != 1 or cancels[0]["sequence"] != {"N": "2"}:
        return None
    updates = [action["Update"] for action in params["TransactItems"] if "Update" in action]
    if len(updates) != 1:
        return None
    # The order item: the version the cancel was decided on is the one before its event's sequence.
    return {"TableName": updates[0]["TableName"], "Key": updates[0]["Key"], "version": {"N": "1"}}


def _envelope_id(detail: Any) -> str:
    """The CloudEvent id of a PutEvents entry's Detail (the envelope itself)."""
    try:
        envelope = json.loads(detail)
    except (TypeError, ValueError):
        return f"undecodable:{hash(detail)}"
    event_id = envelope.get("id") if isinstance(envelope, dict) else None
    return event_id if isinstance(event_id, str) else f"undecodable:{hash(detail)}"


class BatchTracker:
    """Which SQS batch, and which message of it, the consumer is handling (Powertools' batch processor)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.current: Any = None

    def install(self) -> None:
        from aws_lambda_powertools.utilities.batch.base import BasePartialProcessor

        tracker = self
        original = BasePartialProcessor.__call__

        def tracked_call(
            processor: BasePartialProcessor, records: list[dict[str, Any]], handler: Any, *args: Any
        ) -> Any:
            tracker.records = list(records)

            @functools.wraps(handler)
            def tracked_handler(*h_args: Any, **h_kwargs: Any) -> Any:
                tracker.current = h_kwargs.get("record", h_args[0] if h_args else None)
                try:
                    return handler(*h_args, **h_kwargs)
                finally:
                    tracker.current = None

            return original(processor, records, tracked_handler, *args)

        setattr(BasePartialProcessor, "__call__", tracked_call)  # noqa: B010 - patching a dunder

    def current_ids(self) -> tuple[str | None, str | None]:
        """(event id, message id) of the message being handled."""
        record = self.current
        if record is None:
            return None, None
        body = getattr(record, "body", None)
        return _detail_id(body), getattr(record, "message_id", None)

    def receive_counts(self) -> list[int]:
        """ApproximateReceiveCount of each well-formed message of the batch (malformed ones die anyway)."""
        counts = []
        for record in self.records:
            if _detail_id(record.get("body")) is None:
                continue
            counts.append(int((record.get("attributes") or {}).get("ApproximateReceiveCount", "1")))
        return counts


class Injector:
    def __init__(self, plan: Plan, function: str, spec: FunctionPlan) -> None:
        self.plan = plan
        self.function = function
        self.spec = spec
        self.ledger = Ledger(plan.ledger)
        self.state = FunctionState(Path(plan.state_dir), function)
        self.incarnation = self.state.new_incarnation()
        self.rng = seeded_rng(plan.seed, function, self.incarnation)
        self.batch = BatchTracker() if spec.role in {CONSUMER, NOTIFIER} else None
        self._satisfied: set[str] = set()  # kinds with `ensure` known to have happened
        self._persistent: dict[str, int] = {}  # event id -> failures still to inject in this process
        self._slot_read: list[Any] = []  # the logical relay's last peek: its decoded transactions
        # The round's activation of replay sets, committed unless a crash came first: the end of the log
        # position of the first transaction carrying one of their messages, their ids and kinds.
        self._activated: tuple[int, list[int], list[str]] | None = None
        self.arms = Arms(Path(plan.state_dir), function)

    # --- decisions ------------------------------------------------------------------------------
    def _pick(self, candidates: tuple[str, ...]) -> str | None:
        kinds = [kind for kind in candidates if kind in self.spec.faults]
        if not kinds:
            return None
        draw = self.rng.random()
        pending = [k for k in kinds if self.spec.faults[k].ensure and k not in self._satisfied]
        if pending:
            counts = self.state.counts()
            self._satisfied.update(k for k in pending if counts.get(k, 0) > 0)
            pending = [k for k in pending if k not in self._satisfied]
        if pending:
            return pending[0]
        threshold = 0.0
        for kind in kinds:
            threshold += self.spec.faults[kind].probability
            if draw < threshold:
                return kind
        return None

    def _claim(self, kind: str, ids: list[str]) -> bool:
        if not self.state.claim(kind, ids, self.spec.faults[kind].cap):
            return False
        self._satisfied.add(kind)
        return True

    def _record(self, kind: str, operation: str, **details: Any) -> None:
        self.ledger.append(kind, self.function, operation, incarnation=self.incarnation, **details)

    # --- dispatch -------------------------------------------------------------------------------
    def call(self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        service = client.meta.service_model.service_name
        role = self.spec.role
        if role == API and service == "dynamodb" and operation == "TransactWriteItems":
            return self._api(original, client, operation, params)
        if role == RELAY and service == "events" and operation == "PutEvents":
            return self._relay(original, client, operation, params)
        if role == CONSUMER and service == "dynamodb" and operation == "TransactWriteItems":
            tables = {next(iter(action.values())).get("TableName") for action in params["TransactItems"]}
            if tables & set(self.plan.business_tables):
                self._maybe_conflict(operation, params)
                return self._effect(original, client, operation, params, CRASH_AFTER_WRITE)
        if role == NOTIFIER and service == "sns" and operation == "Publish":
            self._watch_lost_responses(client)
            return self._effect(original, client, operation, params, CRASH_AFTER_PUBLISH)
        if (
            role in {CONSUMER, NOTIFIER}
            and service == "dynamodb"
            and operation == "UpdateItem"
            and params.get("TableName") == self.plan.idempotency_table
            and {"S": "COMPLETED"} in (params.get("ExpressionAttributeValues") or {}).values()
        ):
            return self._completion(original, client, operation, params)
        return original(client, operation, params)

    def _watch_lost_responses(self, client: BaseClient) -> None:
        """Record each Publish attempt that ended without a response (the SDK then retries it)."""
        if getattr(client, "_chaos_watched", False):
            return
        setattr(client, "_chaos_watched", True)  # noqa: B010 - a mark on a botocore client

        def on_attempt_end(caught_exception: Exception | None = None, **_: Any) -> None:
            # Sent, maybe received, no answer (a refused connection sent nothing: not counted).
            if isinstance(caught_exception, (ReadTimeoutError, ConnectionClosedError)):
                event_id, message_id = self.batch.current_ids() if self.batch else (None, None)
                self._record(
                    OBSERVED_PUBLISH_RESPONSE_LOST,
                    "Publish",
                    event_ids=[event_id] if event_id else [],
                    message_id=message_id,
                    error=type(caught_exception).__name__,
                )

        client.meta.events.register_first("needs-retry.sns.Publish", on_attempt_end)

    # --- the order API --------------------------------------------------------------------------
    def _api(self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        puts = [action["Put"]["Item"] for action in params["TransactItems"] if "Put" in action]
        event_ids = [item["eventId"]["S"] for item in puts if "eventId" in item]
        order_ids = sorted({item["aggregateId"]["S"] for item in puts if "aggregateId" in item})
        request_keys = [
            item["PK"]["S"] for item in puts if item.get("entityType", {}).get("S") == "RequestKey"
        ]
        # A create is retried under its Idempotency-Key (a new order id each time); a cancel under its event.
        identity = request_keys or event_ids
        candidates: tuple[str, ...] = API_KINDS
        cancel_from_pending = _cancel_from_pending(params, puts)
        if cancel_from_pending is not None:
            candidates = (API_STALE_CANCEL, *API_KINDS)
        kind = self._pick(candidates)
        if kind == API_STALE_CANCEL:
            identity = [f"stale-cancel:{order_id}" for order_id in order_ids]
        if kind is None or not self._claim(kind, identity):
            return original(client, operation, params)
        details = {"event_ids": event_ids, "order_ids": order_ids}
        if kind == API_THROTTLE:
            self._record(kind, operation, **details)
            raise _client_error("ThrottlingException", "rate of requests exceeded", operation)
        if kind == API_CONFLICT:
            self._record(kind, operation, **details)
            reasons = [{"Code": "TransactionConflict", "Message": "chaos: transaction is ongoing"}] + [
                {"Code": "None"} for _ in params["TransactItems"][1:]
            ]
            raise _client_error(
                "TransactionCanceledException",
                "Transaction cancelled [TransactionConflict]",
                operation,
                CancellationReasons=reasons,
            )
        if kind == API_STALE_CANCEL:
            assert cancel_from_pending is not None
            began = time.monotonic()
            raced = self._hold_until_changed(original, client, cancel_from_pending)
            held = round(time.monotonic() - began, 2)
            self._record(kind, operation, raced=raced, held_seconds=held, **details)
            return original(client, operation, params)
        try:
            result = original(client, operation, params)
        except BaseException:
            # Not committed (a conflict, a condition): no timeout after a commit happened. Give the claim
            # back, or a kind with one slot in a small run would be counted as injected and never logged.
            self.state.release(kind, identity)
            self._satisfied.discard(kind)
            raise
        pause = self.plan.client_timeout_seconds + 1.0
        self._record(kind, operation, sleep_seconds=pause, **details)
        time.sleep(pause)  # committed; the client gives up first and retries with the same key
        return result

    @staticmethod
    def _hold_until_changed(original: ApiCall, client: BaseClient, order: dict[str, Any]) -> bool:
        """Wait until the order's version is no longer the one the cancel was decided on (bounded)."""
        expected = order["version"]
        read = {"TableName": order["TableName"], "Key": order["Key"], "ConsistentRead": True}
        deadline = time.monotonic() + _STALE_HOLD_SECONDS
        while time.monotonic() < deadline:
            item = original(client, "GetItem", read).get("Item") or {}
            if item.get("version") != expected:
                return True
            time.sleep(_STALE_POLL_SECONDS)
        return False

    # --- the relay ------------------------------------------------------------------------------
    def _relay(self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        entries: list[dict[str, Any]] = list(params["Entries"])
        ids = [_envelope_id(entry.get("Detail")) for entry in entries]
        if RELAY_CRASH_AROUND_SWITCH in self.spec.faults:
            arm = self.arms.take(incarnation=self.incarnation, pid=os.getpid())
            if arm is not None:
                return self._armed_crash(arm, original, client, operation, params, ids)
        repeat = [position for position, event_id in enumerate(ids) if self._persistent.get(event_id, 0) > 0]
        if repeat:
            for position in repeat:
                self._persistent[ids[position]] -= 1
            return self._fail_entries(original, client, operation, params, set(repeat))
        kind = self._pick(RELAY_KINDS)
        if kind is None:
            return original(client, operation, params)
        if kind in {RELAY_ENTRY_FAILURES, RELAY_ENTRY_FAILURES_PERSISTENT}:
            limit = 1 if kind == RELAY_ENTRY_FAILURES_PERSISTENT else min(_MAX_FAILED_ENTRIES, len(entries))
            positions = set(self.rng.sample(range(len(entries)), self.rng.randint(1, limit)))
            chosen = [ids[p] for p in sorted(positions)]
            if not self._claim(kind, chosen):
                return original(client, operation, params)
            self._record(kind, operation, event_ids=chosen, entries_in_call=len(entries))
            if kind == RELAY_ENTRY_FAILURES_PERSISTENT:
                self._persistent[chosen[0]] = _PERSISTENT_FAILURES - 1
            return self._fail_entries(original, client, operation, params, positions)
        if not self._claim(kind, ids):
            return original(client, operation, params)
        if kind == RELAY_THROTTLE:
            self._record(kind, operation, event_ids=ids)
            raise _client_error("ThrottlingException", "rate exceeded", operation)
        if kind == RELAY_CALL_ERROR:
            self._record(kind, operation, event_ids=ids)
            raise _client_error("InternalException", "internal error", operation, status=500)
        result = original(client, operation, params)
        self._record(kind, operation, event_ids=ids, failed_entry_count=result.get("FailedEntryCount", 0))
        if kind == RELAY_LOST_RESPONSE:
            raise ReadTimeoutError(endpoint_url=client.meta.endpoint_url)
        raise ChaosCrash(f"chaos: {self.function} dies after PutEvents succeeded")

    def _armed_crash(
        self,
        arm: dict[str, Any],
        original: ApiCall,
        client: BaseClient,
        operation: str,
        params: dict[str, Any],
        ids: list[str],
    ) -> Any:
        """A crash the migration function armed at a switch's step: the call goes through, the round's
        locks are held `hold_seconds` (the step waits for them), then the process dies before COMMIT."""
        try:
            result = original(client, operation, params)
        except BaseException:
            self.arms.give_back(int(arm["arm"]))  # nothing went out: the next call takes it
            raise
        hold = float(arm.get("hold_seconds") or 0.0)
        self.state.tally(RELAY_CRASH_AROUND_SWITCH, 1_000_000)
        self._record(
            RELAY_CRASH_AROUND_SWITCH,
            operation,
            event_ids=ids,
            failed_entry_count=result.get("FailedEntryCount", 0),
            switch=arm.get("switch"),
            point=arm.get("point"),
            arm=arm["arm"],
            armed_at=arm["armed_at"],
            hold_seconds=hold,
        )
        time.sleep(hold)
        raise ChaosCrash(
            f"chaos: {self.function} dies after PutEvents, {arm.get('point')} ({arm.get('switch')})"
        )

    @staticmethod
    def _fail_entries(
        original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any], failing: set[int]
    ) -> Any:
        """Send only the other entries; answer the failing ones with InternalFailure, in request order."""
        entries = params["Entries"]
        kept = [entry for position, entry in enumerate(entries) if position not in failing]
        response: dict[str, Any] = (
            original(client, operation, {**params, "Entries": kept})
            if kept
            else {"FailedEntryCount": 0, "Entries": [], "ResponseMetadata": {"HTTPStatusCode": 200}}
        )
        real = iter(response["Entries"])
        merged = [
            {"ErrorCode": "InternalFailure", "ErrorMessage": "chaos: injected entry failure"}
            if position in failing
            else next(real)
            for position in range(len(entries))
        ]
        failed = int(response.get("FailedEntryCount", 0)) + len(failing)
        return {**response, "FailedEntryCount": failed, "Entries": merged}

    # --- the logical relay's slot -----------------------------------------------------------------
    def wrap_slot(self, module: ModuleType) -> None:
        """Wrap the logical relay module's `peek_changes` (to know which rows a round read) and its
        `advance_slot` (the real advance first, then perhaps a crash before the COMMIT)."""
        real_peek: Callable[..., Any] = module.peek_changes
        real_advance: Callable[..., bool] = module.advance_slot
        replication = sys.modules[_REPLICATION_MODULE]  # the copy of `shop` the function runs
        injector = self

        @functools.wraps(real_peek)
        def peek_changes(cursor: Any, slot: str, max_changes: int, **options: Any) -> Any:
            changes = real_peek(cursor, slot, max_changes, **options)  # options: the read's window
            injector._slot_read = list(changes.transactions)
            injector._activated = None  # a new round
            return changes

        @functools.wraps(real_advance)
        def advance_slot(cursor: Any, slot: str, lsn: int) -> bool:
            injector._before_advance(lsn)
            before = int(replication.confirmed_lsn(cursor, slot))
            moved = real_advance(cursor, slot, lsn)
            if moved:
                injector._after_advance(before, lsn)
            return moved

        setattr(module, "peek_changes", peek_changes)  # noqa: B010 - the seam, on purpose
        setattr(module, "advance_slot", advance_slot)  # noqa: B010 - the seam, on purpose
        if any(kind in self.spec.faults for kind in SET_KINDS):
            self.wrap_sets(sys.modules[REPLAYS_MODULE])

    def wrap_sets(self, module: ModuleType) -> None:
        """Wrap the replay sets' `activate` (the round activates the sets whose messages it read) and
        `mark_done` (a chunk of them went out): the real call first, then perhaps a crash before COMMIT."""
        real_activate: Callable[..., None] = module.activate
        real_done: Callable[..., list[int]] = module.mark_done
        injector = self

        @functools.wraps(real_activate)
        def activate(cursor: Any, replay_ids: list[int]) -> None:
            kinds = _set_kinds(cursor, replay_ids=replay_ids) if replay_ids else []
            real_activate(cursor, replay_ids)
            if replay_ids:
                injector._after_activation(list(replay_ids), kinds)

        @functools.wraps(real_done)
        def mark_done(cursor: Any, positions: list[int]) -> list[int]:
            kinds = _set_kinds(cursor, positions=positions) if positions else []
            finished = real_done(cursor, positions)
            if positions:
                injector._after_set_chunk(cursor, list(positions), kinds)
            return finished

        setattr(module, "activate", activate)  # noqa: B010 - the seam, on purpose
        setattr(module, "mark_done", mark_done)  # noqa: B010 - the seam, on purpose

    def _set_fault(self, kind: str) -> bool:
        """Whether to inject `kind` now (the first opportunity, then its probability, up to its cap)."""
        picked = self._pick((kind,))
        if picked is None or not self.state.tally(kind, self.spec.faults[kind].cap):
            return False
        self._satisfied.add(kind)
        return True

    def _after_activation(self, replay_ids: list[int], kinds: list[str]) -> None:
        """Sets activated in the round's transaction: die before its COMMIT? If not, remember where their
        messages are: the advance past them comes after the COMMIT."""
        messages = [t.end_lsn for t in self._slot_read if set(getattr(t, "replay_ids", ())) & set(replay_ids)]
        if self._set_fault(RELAY_CRASH_AFTER_SET_ACTIVATION):
            self._record(RELAY_CRASH_AFTER_SET_ACTIVATION, "activate", replay_ids=replay_ids, set_kinds=kinds)
            raise ChaosCrash(f"chaos: {self.function} dies after activating a replay set, before COMMIT")
        if messages:
            self._activated = (min(messages), replay_ids, kinds)

    def _before_advance(self, lsn: int) -> None:
        """The slot is about to pass a message whose set this round activated (committed by now): die
        before it does?"""
        activated, self._activated = self._activated, None
        if activated is None or lsn < activated[0]:
            self._activated = activated  # not past it yet (the advance before the COMMIT)
            return
        if self._set_fault(RELAY_CRASH_BEFORE_PASSING_SET):
            _, replay_ids, kinds = activated
            self._record(
                RELAY_CRASH_BEFORE_PASSING_SET,
                "advance_slot",
                replay_ids=replay_ids,
                set_kinds=kinds,
                message_lsn=f"{activated[0] >> 32:X}/{activated[0] & 0xFFFFFFFF:X}",
            )
            raise ChaosCrash(f"chaos: {self.function} dies after a set's activation committed")

    def _after_set_chunk(self, cursor: Any, positions: list[int], kinds: list[str]) -> None:
        """Rows of the replay sets on the bus (or parked) and taken out of their sets: die before COMMIT?"""
        if not self._set_fault(RELAY_CRASH_AFTER_SET_CHUNK):
            return
        cursor.execute("SELECT event_id FROM outbox WHERE position = ANY(%s) ORDER BY position", (positions,))
        ids = [str(event_id) for (event_id,) in cursor.fetchall()]
        self._record(RELAY_CRASH_AFTER_SET_CHUNK, "mark_done", event_ids=ids, set_kinds=kinds)
        raise ChaosCrash(f"chaos: {self.function} dies after a chunk of a replay set, before COMMIT")

    # --- the migration function: a relay switch's steps ---------------------------------------------
    def wrap_switch(self, module: ModuleType) -> None:
        """Wrap the relay switch (shop.adapters.postgres.relay_mode): at each of its steps, arm a crash of
        the publisher (see _switch_point); the steps themselves run unchanged."""
        real_switch: Callable[..., str] = module.switch_relay
        real_prepare: Callable[..., None] = module._prepare_slot
        real_drop: Callable[..., bool] = module._drop_slot
        real_to_logical: Callable[..., str] = module._to_logical
        injector = self

        @functools.wraps(real_switch)
        def switch_relay(connection: Any, mode: str, slot: str, **options: Any) -> str:
            # To logical the slot is created first (creating it waits for the rounds in progress); to
            # polling the handover is first (it waits for the round holding the slot's lock).
            first, last = POINTS.get(mode, ("before the switch", "after the switch"))
            injector._switch_point(mode, first, hold=True)
            if mode == "polling":  # committed while the armed round holds the slot: the slot holds it
                injector._poison_at_handover(connection, mode)
            outcome = real_switch(connection, mode, slot, **options)
            injector._switch_point(mode, last, hold=False)
            return outcome

        @functools.wraps(real_to_logical)
        def _to_logical(cursor: Any, slot: str) -> str:
            # As if committed just before the outbox's lock: pending at the handover.
            injector._poison_at_handover(cursor, "logical")
            return real_to_logical(cursor, slot)

        @functools.wraps(real_prepare)
        def _prepare_slot(connection: Any, slot: str, bounds: Any) -> None:
            real_prepare(connection, slot, bounds)
            # The handover locks the outbox: it waits for the polling round holding its rows.
            injector._switch_point("logical", BEFORE_HANDOVER_TO_LOGICAL, hold=True)

        @functools.wraps(real_drop)
        def _drop_slot(connection: Any, slot: str, bounds: Any) -> bool:
            injector._switch_point("polling", BEFORE_SLOT_DROP, hold=False)
            return real_drop(connection, slot, bounds)

        setattr(module, "switch_relay", switch_relay)  # noqa: B010 - the seam, on purpose
        setattr(module, "_prepare_slot", _prepare_slot)  # noqa: B010 - the seam, on purpose
        setattr(module, "_drop_slot", _drop_slot)  # noqa: B010 - the seam, on purpose
        setattr(module, "_to_logical", _to_logical)  # noqa: B010 - the seam, on purpose

    def _switch(self, mode: str) -> dict[str, Any] | None:
        """The switch to `mode` the harness asked for (SWITCH_FILE), None when none."""
        try:
            switch: dict[str, Any] = json.loads((Path(self.plan.state_dir) / SWITCH_FILE).read_text())
        except (OSError, ValueError):
            return None
        return switch if switch.get("to") == mode else None

    def _poison_at_handover(self, executor: Any, mode: str) -> None:
        """The poison row the harness asked for (the switch's "poison_row"), written now: pending when the
        switch hands the outbox over (to logical: in the handover's transaction, as if committed just
        before its lock; to polling: committed while the armed round holds the slot, so the slot still
        holds it at the handover)."""
        switch = self._switch(mode)
        row = switch.get("poison_row") if switch is not None else None
        if switch is None or not row:
            return
        executor.execute(INSERT_POISON_ROW, row["values"])
        self.ledger.append(POISON_OUTBOX_ITEM, str(switch["function"]), "INSERT", **row["details"])

    def _switch_point(self, mode: str, point: str, *, hold: bool) -> None:
        """A step of the switch the harness asked for (SWITCH_FILE) to `mode`: arm the publisher's next
        PutEvents to be its last. Before a step that waits for the rounds in progress (`hold`), the
        armed round holds its locks a while and the switch goes on once a publisher took the arm, so the
        step waits on the round that dies; an arm nobody took in time is withdrawn (the report says so)."""
        switch = self._switch(mode)
        if switch is None:
            return
        arms = Arms(Path(self.plan.state_dir), str(switch["function"]))
        number = arms.arm(
            switch=switch.get("switch"),
            to=mode,
            point=point,
            hold_seconds=float(switch.get("hold_seconds", 0.0)) if hold else 0.0,
            waited=hold,
        )
        if not hold:
            return
        deadline = time.monotonic() + float(switch.get("arm_wait_seconds", 0.0))
        while time.monotonic() < deadline:
            if arms.taken(number):
                return
            time.sleep(_ARM_POLL_SECONDS)
        arms.withdraw(number)

    def _after_advance(self, before: int, lsn: int) -> None:
        """The slot now stands past the rows of the transactions it just confirmed: die before COMMIT?"""
        rows = [row for t in self._slot_read if before < t.end_lsn <= lsn for row in t.rows]
        ids = [str(row.event_id) for row in rows]
        if not ids:
            return  # past WAL without outbox rows: no event's delivery rests on this advance
        kind = self._pick(SLOT_KINDS)
        if kind is None or not self._claim(kind, ids):
            return
        self._record(
            kind,
            "advance_slot",
            event_ids=ids,
            positions=[int(row.position) for row in rows],
            confirmed_lsn=f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}",  # as pg_lsn prints it
        )
        raise ChaosCrash(f"chaos: {self.function} dies after its slot advance, before COMMIT")

    # --- consumers ------------------------------------------------------------------------------
    def _may_fail_batch(self) -> tuple[str, str | None] | None:
        """The current message's ids when failing its whole batch keeps every message off the DLQ."""
        assert self.batch is not None
        event_id, message_id = self.batch.current_ids()
        if event_id is None:
            return None
        if any(count > self.plan.max_receive_count - 2 for count in self.batch.receive_counts()):
            return None
        return event_id, message_id

    def _maybe_conflict(self, operation: str, params: dict[str, Any]) -> None:
        """Each attempt of the business transaction may be cancelled by an overlapping one, as on a hot
        item in AWS, whatever happened to the attempts before it (the consumer must ride it out)."""
        fault = self.spec.faults.get(CONSUMER_CONFLICT)
        if fault is None or self.rng.random() >= fault.probability:
            return
        if not self.state.tally(CONSUMER_CONFLICT, fault.cap):
            return
        event_id, message_id = self.batch.current_ids() if self.batch else (None, None)
        self._record(CONSUMER_CONFLICT, operation, event_ids=[event_id], message_id=message_id)
        reasons = [{"Code": "None"} for _ in params["TransactItems"][1:]]
        raise _client_error(
            "TransactionCanceledException",
            "Transaction cancelled [TransactionConflict]",
            operation,
            CancellationReasons=[{"Code": "TransactionConflict", "Message": "chaos: hot item"}, *reasons],
        )

    def _effect(
        self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any], after: str
    ) -> Any:
        ids = self._may_fail_batch()
        if ids is None:
            return original(client, operation, params)
        event_id, message_id = ids
        kind = self._pick((CRASH_BEFORE_WRITE, CONSUMER_TIMEOUT, after))
        if kind is None or not self._claim(kind, [event_id]):
            return original(client, operation, params)
        details = {"event_ids": [event_id], "message_id": message_id}
        if kind == CRASH_BEFORE_WRITE:
            self._record(kind, operation, **details)
            raise ChaosCrash(f"chaos: {self.function} dies before {operation}")
        if kind == CONSUMER_TIMEOUT:
            pause = self.spec.timeout_seconds + 5.0
            self._record(kind, operation, sleep_seconds=pause, **details)
            time.sleep(pause)  # the runtime ends the invocation at its deadline; the record stays IN_PROGRESS
            return original(client, operation, params)
        original(client, operation, params)
        self._record(kind, operation, **details)
        raise ChaosCrash(f"chaos: {self.function} dies after {operation}")

    def _completion(
        self, original: ApiCall, client: BaseClient, operation: str, params: dict[str, Any]
    ) -> Any:
        ids = self._may_fail_batch()
        if ids is None:
            return original(client, operation, params)
        event_id, message_id = ids
        kind = self._pick((CRASH_AFTER_COMPLETE,))
        if kind is None or not self._claim(kind, [event_id]):
            return original(client, operation, params)
        original(client, operation, params)
        self._record(kind, operation, event_ids=[event_id], message_id=message_id)
        raise ChaosCrash(f"chaos: {self.function} dies after its idempotency record completed")


def _set_kinds(
    cursor: Any, *, replay_ids: list[int] | None = None, positions: list[int] | None = None
) -> list[str]:
    """The kinds (replay, handover, spill) of the sets with these ids, or naming these rows."""
    if replay_ids is not None:
        cursor.execute("SELECT DISTINCT kind FROM outbox_replay WHERE replay_id = ANY(%s)", (replay_ids,))
    else:
        cursor.execute(
            "SELECT DISTINCT s.kind FROM outbox_replay_rows AS r JOIN outbox_replay AS s"
            " ON s.replay_id = r.replay_id WHERE r.position = ANY(%s)",
            (positions,),
        )
    return sorted(str(kind) for (kind,) in cursor.fetchall())


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, then `then(module)` once the module has run (its names exist)."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then` on module `name` when it is first imported (the function imports it from its own
    layer, after this preload narrowed nothing: the wrapped module is the one the handler uses)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._then = then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if find is not None else None
            )
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenLoader(spec.loader, self._then)
                return spec
        return None


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """`then(module)` now if `name` is imported already, else right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def install(environ: dict[str, str] | None = None) -> Injector | None:
    """Wrap botocore for this function if the plan names it; None (nothing wrapped) otherwise."""
    env = dict(os.environ) if environ is None else environ
    raw = env.get(PLAN_ENV)
    if not raw:
        return None
    plan = Plan.from_json(raw)
    function = env.get("AWS_LAMBDA_FUNCTION_NAME", "").removeprefix(f"{plan.stack_name}-")
    spec = plan.functions.get(function)
    if spec is None:
        return None
    injector = Injector(plan, function, spec)
    original: ApiCall = getattr(BaseClient, "_make_api_call")  # noqa: B009 - a private method, on purpose

    @functools.wraps(original)
    def make_api_call(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        return injector.call(original, client, operation, params)

    setattr(BaseClient, "_make_api_call", make_api_call)  # noqa: B010 - the seam, on purpose
    if injector.batch is not None:
        injector.batch.install()
    if (
        spec.role == RELAY
        and env.get("POSTGRES_RELAY") == "logical"
        and any(kind in spec.faults for kind in (*SLOT_KINDS, *SET_KINDS))
    ):
        after_import(LOGICAL_RELAY_MODULE, injector.wrap_slot)
    if spec.role == MIGRATION:
        after_import(RELAY_MODE_MODULE, injector.wrap_switch)
    return injector


INJECTOR = install()
