"""The run's fault plan (plan.Plan, handed to every function worker as CHAOS_PLAN): which functions get
faults, by role, and each kind's probability per opportunity and cap, sized to the run (small runs still
see every kind once); the kinds the order store and its relay have no hook for are left out."""

from __future__ import annotations

from pathlib import Path

from tools.chaos.config import HOT_SKU_CONFLICT_PROBABILITY, ChaosConfig
from tools.chaos.plan import (
    API,
    API_CONFLICT,
    API_STALE_CANCEL,
    API_THROTTLE,
    API_TIMEOUT_AFTER_COMMIT,
    CONSUMER,
    CONSUMER_CONFLICT,
    CONSUMER_TIMEOUT,
    CRASH_AFTER_COMPLETE,
    CRASH_AFTER_PUBLISH,
    CRASH_AFTER_WRITE,
    CRASH_BEFORE_WRITE,
    MIGRATION,
    NOTIFIER,
    OPERATION_FAULT_KINDS,
    RELAY,
    RELAY_CALL_ERROR,
    RELAY_CRASH_AFTER_ADVANCE,
    RELAY_CRASH_AFTER_PUT,
    RELAY_CRASH_AFTER_SET_ACTIVATION,
    RELAY_CRASH_AFTER_SET_CHUNK,
    RELAY_CRASH_AROUND_SWITCH,
    RELAY_CRASH_BEFORE_PASSING_SET,
    RELAY_ENTRY_FAILURES,
    RELAY_ENTRY_FAILURES_PERSISTENT,
    RELAY_LOST_RESPONSE,
    RELAY_THROTTLE,
    SLOT_KINDS,
    FaultSpec,
    FunctionPlan,
    Plan,
    not_applicable,
)
from tools.chaos.publishers import PUBLISHER
from tools.chaos.relay_operations import MIGRATION_FUNCTION
from tools.template import Template

ROLES = {
    "OrdersApiFunction": API,
    "OutboxRelayFunction": RELAY,
    "InventoryFunction": CONSUMER,
    "OrderStatusFunction": CONSUMER,
    "NotificationFunction": NOTIFIER,
}


def _cap(orders: int, per: int, most: int) -> int:
    return max(1, min(most, orders // per))


def roles(config: ChaosConfig) -> dict[str, str]:
    """The functions faults are injected in, by role: with postgres, the polling publisher is a relay;
    with the relay operations, the migration function arms the publisher's crashes at a switch's steps."""
    found = {**ROLES, PUBLISHER: RELAY} if config.postgres else dict(ROLES)
    if config.operations:
        found[MIGRATION_FUNCTION] = MIGRATION
    return found


def fault_plan(config: ChaosConfig, template: Template, ledger: Path, state: Path) -> Plan:
    """Probabilities per opportunity and caps, sized to the run (small runs still see every kind once)."""
    n = config.orders
    spec = FaultSpec
    consumer = {
        CRASH_BEFORE_WRITE: spec(0.01, _cap(n, 100, 20)),
        CONSUMER_TIMEOUT: spec(0.003, _cap(n, 300, 4)),
        CRASH_AFTER_WRITE: spec(0.01, _cap(n, 100, 20)),
        CRASH_AFTER_COMPLETE: spec(0.01, _cap(n, 100, 20)),
    }
    if config.hot_sku:
        # Far more conflicts than maxReceiveCount per message would be allowed as failed receives.
        consumer[CONSUMER_CONFLICT] = spec(HOT_SKU_CONFLICT_PROBABILITY, 100 * n)
    notifier = {**consumer, CRASH_AFTER_PUBLISH: spec(0.01, _cap(n, 100, 20))}
    notifier.pop(CONSUMER_CONFLICT, None)  # SNS Publish is no transaction
    del notifier[CRASH_AFTER_WRITE]
    faults: dict[str, dict[str, FaultSpec]] = {
        API: {
            API_THROTTLE: spec(0.03, _cap(n, 30, 100)),
            API_CONFLICT: spec(0.03, _cap(n, 30, 100)),
            API_TIMEOUT_AFTER_COMMIT: spec(0.01, _cap(n, 100, 25)),
            # Only cancels of PENDING orders are candidates: most of them are held.
            API_STALE_CANCEL: spec(0.5, _cap(n, 25, 40)),
        },
        RELAY: {
            RELAY_THROTTLE: spec(0.02, _cap(n, 50, 50)),
            RELAY_CALL_ERROR: spec(0.01, _cap(n, 100, 30)),
            RELAY_LOST_RESPONSE: spec(0.01, _cap(n, 100, 30)),
            RELAY_ENTRY_FAILURES: spec(0.03, _cap(n, 50, 50)),
            RELAY_ENTRY_FAILURES_PERSISTENT: spec(0.01, _cap(n, 100, 20)),
            RELAY_CRASH_AFTER_PUT: spec(0.01, _cap(n, 100, 20)),
            # The logical relay's only (_applicable): per advance past outbox rows, as a crash after
            # PutEvents is per call.
            RELAY_CRASH_AFTER_ADVANCE: spec(0.01, _cap(n, 100, 20)),
            # With the relay operations only (_applicable): per activation of replay sets, per advance
            # past an activated set's message, per chunk of a set drained; and the crashes the migration
            # function arms at a switch's steps (never drawn: each arm is one).
            RELAY_CRASH_AFTER_SET_ACTIVATION: spec(0.5, _cap(n, 500, 3)),
            RELAY_CRASH_BEFORE_PASSING_SET: spec(0.5, _cap(n, 500, 3)),
            RELAY_CRASH_AFTER_SET_CHUNK: spec(0.1, _cap(n, 200, 10)),
            RELAY_CRASH_AROUND_SWITCH: spec(0.0, 1_000, ensure=False),
        },
        CONSUMER: consumer,
        NOTIFIER: notifier,
        MIGRATION: {},
    }
    receives = config.max_receive_count or int(template.parameter_values["ConsumerMaxReceiveCount"])
    return Plan(
        seed=config.seed,
        stack_name=template.stack_name,
        ledger=str(ledger),
        state_dir=str(state),
        max_receive_count=receives,
        client_timeout_seconds=config.client_timeout_seconds,
        idempotency_table=template.physical_name("IdempotencyTable"),
        business_tables=(template.physical_name("OrdersTable"), template.physical_name("InventoryTable")),
        functions={
            name: FunctionPlan(
                role, float(template.function(name).timeout), _applicable(config, name, faults[role])
            )
            for name, role in roles(config).items()
        },
    )


def _applicable(config: ChaosConfig, function: str, faults: dict[str, FaultSpec]) -> dict[str, FaultSpec]:
    """The function's faults whose hook the order store and its relay have (plan.not_applicable names
    the ones left out; the slot's kinds are never the stream relay's)."""
    missing = set(not_applicable(config.postgres, config.postgres_relay).get(function, ()))
    if function != PUBLISHER or not config.logical:
        missing |= set(SLOT_KINDS)
    if function != PUBLISHER or not config.operations:
        missing |= set(OPERATION_FAULT_KINDS)
    return {kind: spec for kind, spec in faults.items() if kind not in missing}
