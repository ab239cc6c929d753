"""What a chaos run is asked for (ChaosConfig, from the environment in __main__.py): the orders, the
seed, the order store and its relay, the faults' switches and the phases' bounds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tools.template import ROOT, Template

DEFAULT_OUT_DIR = ROOT / ".chaos"
DYNAMODB, POSTGRES = "dynamodb", "postgres"
ORDER_STORES = (DYNAMODB, POSTGRES)
POLLING, LOGICAL = "polling", "logical"  # the template's PostgresRelay (postgres_relays(): all it allows)


@dataclass
class ChaosConfig:
    orders: int = 200
    seed: int = 7
    workers: int = 6
    # Orders created per second at most. Faster than the local pipeline drains (one moto process for
    # EventBridge, SQS and SNS; about 6 orders/s with faults on 2 idle cores, docs/performance.md), queues
    # back up and drain slowly.
    rate: float | None = 4.0
    client_timeout_seconds: float = 3.0
    drain_timeout_seconds: float | None = None  # None: from the number of orders
    # Poison on purpose (outbox items the relay cannot decode, malformed consumer messages). Off, a
    # drain no longer waits maxReceiveCount visibility timeouts for the malformed messages' DLQs.
    inject_poison: bool = True
    max_receive_count: int | None = None  # None: the template's ConsumerMaxReceiveCount
    # The relay's batches per shard at once (None: the template's). Above 1, AWS keeps order per item
    # only: one order's events may be published out of order, and the invariants must still hold.
    parallelization_factor: int | None = None
    # Every order on one SKU, and each consumer's business transaction cancelled for TransactionConflict
    # at HOT_SKU_CONFLICT_PROBABILITY per attempt (make chaos-scenarios: hot-sku).
    hot_sku: bool = False
    duplicate_id_prefixes: int = 1  # of 16 hex digits: the share of each consumer's events sent twice
    out_dir: Path = DEFAULT_OUT_DIR
    stack_name: str = "chaos"
    quiet: bool = False
    # The template's OrderStore: "dynamodb", or "postgres" (the module docstring says what changes).
    order_store: str = DYNAMODB
    # postgres: the template's PostgresRelay, "polling" or "logical" (the module docstring).
    postgres_relay: str = POLLING
    # postgres: the database is restarted once, when this share of the orders has been sent (None: never),
    # and stays down this long between its stop and its start.
    restart_at: float | None = 0.55
    database_down_seconds: float = 5.0
    # postgres: publishers at once (the schedule's one and direct invocations) in each half of the drive,
    # then while draining.
    publishers_at_once: tuple[int, int] = (2, 4)
    drain_publishers: int = 2
    # postgres: MaxEventBytes of the run. The oversize poison row is one byte over it; at this size it
    # still fits one poison queue message, so it is parked whole (a row over the queue's 256 KiB would be
    # parked without its item).
    max_event_bytes: int = 32_768
    # postgres: the relay's operations mid-drive (tools/chaos/relay_operations.py): None, with the logical
    # relay only. At these shares of the orders sent: the operator's replays of everything written so far
    # (the order database holds about 2 events per order: at 70 % and 97 % of 2,000 orders over 6,000
    # events replayed in all; a replay comes after the switches due before it), and a deploy switching to
    # the other relay, then one switching back (the first meets the first replay's set draining: it waits
    # until half of it is out, and hands the rest back). None: not done.
    relay_operations: bool | None = None
    replays_at: tuple[float, ...] = (0.7, 0.97)
    switches_at: tuple[float, float] | None = (0.72, 0.8)
    # And a poison row pending at each switch's handover (written by the migration function's hooks:
    # to logical in the handover's transaction, to polling while the slot still holds it).
    poison_at_handover: bool = True

    def __post_init__(self) -> None:
        if self.order_store not in ORDER_STORES:
            raise ValueError(f"order_store must be one of {ORDER_STORES}, not {self.order_store!r}")
        if self.postgres_relay != POLLING and not self.postgres:
            raise ValueError(
                f"postgres_relay {self.postgres_relay!r} needs order_store {POSTGRES!r}: "
                "PostgresRelay chooses how the PostgreSQL outbox reaches the bus"
            )

    @property
    def postgres(self) -> bool:
        return self.order_store == POSTGRES

    @property
    def logical(self) -> bool:
        """The PostgreSQL outbox read from a replication slot (PostgresRelay=logical)."""
        return self.postgres and self.postgres_relay == LOGICAL

    @property
    def operations(self) -> bool:
        """The relay operations run (postgres only; by default with the logical relay)."""
        wanted = self.relay_operations if self.relay_operations is not None else self.logical
        return self.postgres and wanted and bool(self.replays_at or self.switches_at)

    @property
    def drain_timeout(self) -> float:
        if self.drain_timeout_seconds is not None:
            return self.drain_timeout_seconds
        # The relay operations put thousands more events on the bus late in the drive (the replay): the
        # local pipeline (one moto process) works them off in the drain.
        return max(240.0, self.orders * 0.6) * (2 if self.operations else 1)


# Each attempt: P(5 conflicts in a row) = 0.6**5 = 8 %, so without in-process retries about one message
# in twelve would use up its 5 receives and be dead-lettered, its order left PENDING.
HOT_SKU_CONFLICT_PROBABILITY = 0.6


def postgres_relays(template: Template | None = None) -> tuple[str, ...]:
    """What the template's PostgresRelay allows (AllowedValues)."""
    data = (template or Template.load()).data
    return tuple(str(value) for value in data["Parameters"]["PostgresRelay"]["AllowedValues"])
