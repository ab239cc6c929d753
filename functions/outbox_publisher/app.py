"""Outbox publisher (OrderStore=postgres): from the order database's outbox to the bus.

PostgresRelay=polling reads the outbox table (shop.runtime.polling_publisher): two invocations
overlapping share the work without reordering an order's events (claims are per order, FOR UPDATE SKIP
LOCKED). PostgresRelay=logical reads the outbox's inserts from the write-ahead log through a replication
slot (shop.runtime.logical_relay): one invocation at a time holds the slot, the next waits its turn; a
lost slot stops each invocation at its first round, with one error line naming the slot, its state and
the runbook entry. An invocation of the configuration a relay switch left behind (its environment still
running the old PostgresRelay while the deploy goes on) publishes nothing and ends at once, saying so
(RelayModeMismatch): the new configuration's invocations publish; were the two to stay apart, the
outbox's pending age says the relay stopped.
Started by EventBridge Scheduler every minute; each invocation keeps reading until its last seconds,
so the publish lag stays under a second.
"""

from __future__ import annotations

import gc
from dataclasses import asdict
from functools import cache
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from shop.adapters.eventbridge import EventPublisher
from shop.adapters.poison_queue import PoisonQueue
from shop.adapters.postgres.outbox import OutboxRow, RelayModeMismatch
from shop.adapters.postgres.slot_recovery import RUNBOOK, ReplicationSlotLost
from shop.runtime import invocation
from shop.runtime.config import get_settings
from shop.runtime.observability import logger, metrics, tracer
from shop.runtime.outbox_publishing import PublishOutcome, log_published
from shop.runtime.polling_publisher import poll_outbox
from shop.runtime.wiring import postgres_relay
from shop.runtime.wiring import relay as wiring


@cache
def event_publisher() -> EventPublisher:
    return wiring.event_publisher(get_settings())


@cache
def poison_queue() -> PoisonQueue:
    return wiring.poison_queue(get_settings())


def publish_round() -> PublishOutcome[OutboxRow]:
    outcome = postgres_relay.publish_round(get_settings(), event_publisher(), poison_queue())
    log_published(outcome)
    return outcome


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    invocation.begin(context)
    try:
        totals = poll_outbox(publish_round, invocation.seconds_left)
    except ReplicationSlotLost as exc:
        # One line that says what happened and what to do, then the invocation fails (the publisher's
        # errors alarm; the maintenance function's ReplicationSlotLost metric has its own).
        logger.error(
            "replication slot lost",
            extra={
                "slot": exc.state.slot,
                "slot_state": exc.state.describe(),
                "confirmed_flush_lsn": exc.state.confirmed_flush_lsn,
                "runbook": RUNBOOK,
                "error": str(exc),
            },
        )
        raise
    except RelayModeMismatch as exc:
        logger.warning(
            "relay switched: this configuration publishes nothing",
            extra={"running_as": exc.running, "outbox_relay_mode": exc.mode, "error": str(exc)},
        )
        metrics.add_metric(name="RelayModeMismatch", unit=MetricUnit.Count, value=1)
        return {"relayModeMismatch": {"runningAs": exc.running, "outboxRelayMode": exc.mode}}
    logger.info("polling ended", extra=asdict(totals))
    return asdict(totals)


# The objects the init created (modules, clients, settings) live as long as the environment: out of the
# cyclic garbage collector's way, whose full passes otherwise walk them all again while the relay decodes
# and publishes (a fifth of the logical relay's CPU per event: docs/performance.md, "Relays at AWS latency").
gc.freeze()
