"""Order database migration (OrderStore=postgres): the CloudFormation custom resource OrderDatabaseSchema.

On Create and Update it applies the schema's migrations not applied yet (shop.adapters.postgres.schema,
yoyo), then makes the resource's `RelayMode` property (the template's PostgresRelay) the outbox's relay
(shop.adapters.postgres.relay_mode: the logical relay's publication and slot created, or dropped, with
the rows' publishing state handed over). On Delete it drops the slot, which would otherwise hold WAL for
ever, and keeps the data (the cluster's own deletion policy decides its fate).

The relay mode comes from the request, not from this function's environment: CloudFormation sends an
Update when, and because, the resource's properties changed, and sends them; the environment is that of
the version behind the alias `live`, which a parameter change alone may leave in place (SAM names the
version from the function's properties as written, with their parameter references unresolved), and
a rollback sends the previous properties back, which the environment would not follow.
CloudFormation waits for the answer PUT to the request's presigned URL: every path answers, failures
included, before the function's own deadline (context.get_remaining_time_in_millis(), less what the answer
itself needs), or the stack would wait for the resource's ServiceTimeout. Each step is bounded by that
time: yoyo's lock and every migration statement, the switch's locks (lock_timeout, LOCK_WAIT_SECONDS at
most: writers queue behind a switch waiting for the outbox) and its statements (statement_timeout), all
SET LOCAL in the transaction that needs them; a step that cannot start or finish in time fails the
request, with the reason, having changed nothing that step was to change.

A Create that fails before it reached the database (unreachable, its password or settings missing, an
invalid request) answers the physical id NOT_CREATED: CloudFormation deletes a resource whose Create
failed with the id of that answer, and a Delete of NOT_CREATED answers SUCCESS without connecting, so the
rollback, and a later `sam delete`, do not fail in turn on a database that was never reached. Every
other resource's Delete connects, to drop the slot.
The function runs once per request: Lambda does not retry it (EventInvokeConfig, template), since a late
retry of an old request would undo what came after it (a rollback's switch back); an answer CloudFormation
refuses is logged, not raised, for the same reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import urllib3
from aws_lambda_powertools.utilities.typing import LambdaContext
from urllib3.exceptions import HTTPError

from shop.adapters.postgres.connection import PasswordUnavailable, open_connection
from shop.adapters.postgres.relay_mode import SwitchOutOfTime, drop_relay_slot, switch_relay
from shop.adapters.postgres.replication import slot_name
from shop.adapters.postgres.schema import apply_migrations
from shop.runtime.config import POSTGRES_RELAYS, get_settings
from shop.runtime.observability import logger
from shop.runtime.wiring.order_database import connection_settings

PHYSICAL_ID = "order-database-schema"
NOT_CREATED = "order-database-schema-not-created"  # a Create failed before it reached the database
MAX_RESPONSE_BYTES = 4096  # CloudFormation's limit on the whole answer (crpg-ref-responses)
CUT = " [cut]"  # ends a reason cut to fit
RELAY_MODE = "RelayMode"  # OrderDatabaseSchema's property: !Ref PostgresRelay
ANSWER_SECONDS = 15.0  # kept for the answer: its PUT (ANSWER_TIMEOUT_SECONDS, retried once) and a margin
ANSWER_TIMEOUT_SECONDS = 5.0
MIN_WORK_SECONDS = 5.0  # less than this left: answer FAILED at once, nothing started
LOCK_WAIT_SECONDS = 10.0  # any one lock: the outbox's (writers wait behind it), the slot's, yoyo's
# The database password's client is set for the order API's 10 s (shop.adapters.aws: 2 attempts of 1 s to
# connect and 1 s to read). A deploy has minutes: a fetch that fails is tried again after this pause while
# they last, rather than failing the deploy, and rolling it back, on a second's hiccup of Secrets Manager.
PASSWORD_RETRY_SECONDS = 2.0


class InvalidRequest(ValueError):
    """The request does not say what to do: answered FAILED, nothing changed."""


def relay_mode(event: dict[str, Any], environment_mode: str) -> str:
    """The relay the request asks for: its RelayMode property.

    The one request without it that is answered: a rollback to the template from before the property
    (an Update whose OldResourceProperties, the failed update's, have it), for which the relay was the
    function's environment, as that template meant it; a FAILED answer would leave the stack in
    UPDATE_ROLLBACK_FAILED."""
    properties = event.get("ResourceProperties") or {}
    if RELAY_MODE not in properties:
        old = event.get("OldResourceProperties") or {}
        if event["RequestType"] == "Update" and RELAY_MODE in old:
            logger.warning(
                "rollback to a template without RelayMode: the function's environment decides",
                extra={"relay": environment_mode},
            )
            return environment_mode
        raise InvalidRequest(
            f"ResourceProperties.{RELAY_MODE} is missing: the custom resource must carry the relay mode "
            f"(RelayMode: !Ref PostgresRelay), one of {', '.join(POSTGRES_RELAYS)}"
        )
    mode = properties[RELAY_MODE]
    if mode not in POSTGRES_RELAYS:
        raise InvalidRequest(
            f"ResourceProperties.{RELAY_MODE} is {mode!r}, not one of {', '.join(POSTGRES_RELAYS)}"
        )
    return str(mode)


def response_body(
    event: dict[str, Any], status: str, reason: str, data: dict[str, str], physical_id: str
) -> bytes:
    """The custom resource response (CloudFormation's documented fields) as JSON, at most
    MAX_RESPONSE_BYTES: past them CloudFormation reports only "Response object is too long", so a long
    reason keeps its start, as much of it as fits once escaped (a non-ASCII character takes 6 bytes)."""

    def encoded(text: str) -> bytes:
        return json.dumps(
            {
                "Status": status,
                "Reason": text,
                "PhysicalResourceId": physical_id,
                "StackId": event["StackId"],
                "RequestId": event["RequestId"],
                "LogicalResourceId": event["LogicalResourceId"],
                "Data": data,
            }
        ).encode()

    body = encoded(reason)
    if len(body) <= MAX_RESPONSE_BYTES:
        return body
    room = MAX_RESPONSE_BYTES - len(encoded(CUT))
    kept = 0
    for character in reason:
        room -= len(json.dumps(character)) - 2  # the character as the body holds it, escaped
        if room < 0:
            break
        kept += 1
    return encoded(reason[:kept] + CUT)


def answer(
    event: dict[str, Any],
    status: str,
    reason: str,
    data: dict[str, str],
    seconds_left: Callable[[], float] = lambda: ANSWER_SECONDS,
    physical_id: str | None = None,
) -> None:
    """PUT the response to the request's presigned S3 URL. A PUT that fails is logged, not raised: an
    error would make Lambda run the request again (its asynchronous retries), which must not happen."""
    body = response_body(
        event, status, reason, data, physical_id or event.get("PhysicalResourceId", PHYSICAL_ID)
    )
    # urllib3 comes with botocore; CloudFormation's presigned URL takes an empty content type.
    timeout = max(min(ANSWER_TIMEOUT_SECONDS, seconds_left() / 2), 0.5)
    failure = {
        "request_id": event.get("RequestId"),
        "request_type": event.get("RequestType"),
        "answer": status,
    }
    try:
        response = urllib3.PoolManager().request(
            "PUT", event["ResponseURL"], body=body, headers={"Content-Type": ""}, timeout=timeout, retries=1
        )
    except HTTPError as exc:
        logger.error(
            "the answer did not reach CloudFormation: the stack waits for the resource's ServiceTimeout",
            extra=failure | {"error": f"{type(exc).__name__}: {exc}"},
        )
        return
    if response.status >= 300:
        logger.error(
            "CloudFormation refused the answer: the stack waits for the resource's ServiceTimeout",
            extra=failure | {"status": response.status},
        )


def failure_reason(exc: BaseException) -> str:
    """What the FAILED answer says: the error, and what it means for the deploy."""
    reason = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return (
            f"{reason} (a lock was not granted within {LOCK_WAIT_SECONDS:.0f} s: a long transaction, a "
            "publisher round or another migration held the outbox, its slot or the schema; nothing of "
            "that step was changed; deploy again)"
        )
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return (
            f"{reason} (a statement ran past the time the function had left: the migration or the switch it "
            "belonged to changed nothing; migrations applied before it stay applied; deploy again)"
        )
    return reason


class Progress:
    """How far a request got: until it connected to the database, nothing there can have changed."""

    def __init__(self) -> None:
        self.connected = False


def handle(
    event: dict[str, Any], seconds_left: Callable[[], float], progress: Progress | None = None
) -> tuple[str, dict[str, str]]:
    """Migrate and switch (Create, Update) or drop the slot (Delete) within `seconds_left`; the answer's
    reason and data. Raises on any failure; `progress` says whether it had reached the database."""
    progress = progress or Progress()
    request_type = event.get("RequestType")
    if request_type not in ("Create", "Update", "Delete"):
        raise InvalidRequest(f"RequestType {request_type!r} is not Create, Update or Delete")
    if request_type == "Delete" and event.get("PhysicalResourceId") == NOT_CREATED:
        logger.info(
            "order database schema: its Create had failed before reaching the database; nothing to delete"
        )
        return "nothing to delete: the Create had failed before it reached the database", {
            "Applied": "",
            "Relay": "",
        }
    if seconds_left() < MIN_WORK_SECONDS:
        raise SwitchOutOfTime(
            f"{seconds_left() + ANSWER_SECONDS:.1f} s left in the invocation, {ANSWER_SECONDS:.0f} s of it "
            "kept to answer: too little to migrate or switch anything; nothing was changed"
        )
    settings = get_settings()
    slot = slot_name(settings.database_name)
    database = connection_settings(settings)
    if request_type == "Delete":
        with open_connection(database) as connection:
            dropped = drop_relay_slot(
                connection, slot, seconds_left=seconds_left, lock_wait_seconds=LOCK_WAIT_SECONDS
            )
        relay = "slot dropped" if dropped else "no slot"
        logger.info("order database schema", extra={"request_type": request_type, "relay": relay})
        return f"applied 0 migration(s); relay: {relay}", {"Applied": "", "Relay": ""}
    mode = relay_mode(event, settings.postgres_relay)  # before anything changes
    # Connected before migrating: a Create failing after this point may have changed the database, and
    # answers the physical id whose Delete drops what it may have created (the slot).
    with open_connection(database) as connection:
        progress.connected = True
        applied = apply_migrations(database, seconds_left=seconds_left, lock_wait_seconds=LOCK_WAIT_SECONDS)
        relay = switch_relay(
            connection, mode, slot, seconds_left=seconds_left, lock_wait_seconds=LOCK_WAIT_SECONDS
        )
    logger.info(
        "order database schema", extra={"request_type": request_type, "applied": applied, "relay": relay}
    )
    return f"applied {len(applied)} migration(s); relay: {relay}", {
        "Applied": ",".join(applied),
        "Relay": mode,
    }


def with_the_password_fetched_again[T](work: Callable[[], T], seconds_left: Callable[[], float]) -> T:
    """`work`, run again while the database password cannot be fetched and the time left allows it. The
    password is needed to connect, so nothing was changed when it failed; `handle` is safe to run again
    (a deploy run again: every step is idempotent)."""
    while True:
        try:
            return work()
        except PasswordUnavailable as exc:
            if seconds_left() < MIN_WORK_SECONDS + PASSWORD_RETRY_SECONDS:
                raise
            logger.warning("order database password not fetched; trying again", extra={"error": str(exc)})
            time.sleep(PASSWORD_RETRY_SECONDS)


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> None:
    def remaining() -> float:
        return context.get_remaining_time_in_millis() / 1000

    def seconds_left() -> float:  # the work's time: what is left after it is the answer's
        return remaining() - ANSWER_SECONDS

    progress = Progress()
    try:
        reason, data = with_the_password_fetched_again(
            lambda: handle(event, seconds_left, progress), seconds_left
        )
        status = "SUCCESS"
    except Exception as exc:  # noqa: BLE001 (any failure must still answer CloudFormation, with its reason)
        logger.exception("order database migration failed")
        status, reason, data = "FAILED", failure_reason(exc), {}
    physical_id = event.get("PhysicalResourceId") or (
        PHYSICAL_ID if status == "SUCCESS" or progress.connected else NOT_CREATED
    )
    answer(event, status, reason, data, remaining, physical_id)
