"""Fault injection inside a function's worker process, loaded through LOCAL_WORKER_PRELOAD.

Configured by the CHAOS_PLAN environment variable (chaos.plan.Plan as JSON). It wraps botocore's
BaseClient._make_api_call, through which every AWS call of the function passes (and the PostgreSQL
publisher's PutEvents over awscrt, shop.adapters.eventbridge_crt, which does not), and in consumers it
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

The machinery is tools/chaos/injection.py; the faults of each role are in faults_api.py,
faults_relay.py, faults_migration.py and faults_consumer.py.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from botocore.client import BaseClient

from tools.chaos.faults_api import ApiFaults
from tools.chaos.faults_consumer import ConsumerFaults
from tools.chaos.faults_migration import RELAY_MODE_MODULE, MigrationFaults
from tools.chaos.faults_relay import LOGICAL_RELAY_MODULE, RelayFaults
from tools.chaos.injection import ApiCall, after_import, wrap_crt_put_events
from tools.chaos.plan import (
    API,
    CONSUMER,
    CRASH_AFTER_PUBLISH,
    CRASH_AFTER_WRITE,
    MIGRATION,
    NOTIFIER,
    PLAN_ENV,
    RELAY,
    SET_KINDS,
    SLOT_KINDS,
    Plan,
)


class Injector(ApiFaults, RelayFaults, MigrationFaults, ConsumerFaults):
    """The faults of every role; `call` sends each AWS call of the function to its role's hook."""

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
    if spec.role == RELAY:
        wrap_crt_put_events(injector._relay)
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


install()
