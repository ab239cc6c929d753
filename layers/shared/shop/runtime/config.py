"""Configuration: every environment variable the package reads, read here and nowhere else.

Settings are parsed once per process; the X-Ray trace header changes with every invocation, so it is
read at each use (trace_header_from_env, handed to the repositories as a callable).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from typing import NamedTuple

EVENTBRIDGE_MAX_ENTRY_BYTES = 262_144  # PutEvents default limit per entry and per request
DAY_SECONDS = 86_400
# The outbox TTL is the republish window: redrive, replay and the bus archive (kept as long) can put
# an event on the bus again until then. EventBridge may then retry its delivery to the consumer queue
# for a day (the rule target's MaximumEventAgeInSeconds), and the message still wait in that queue
# (4 days' retention) and its DLQ (14 days) before a consumer sees it. Consumers remember event ids
# for all of it, so no redelivery inside the window repeats an effect (tests/unit/test_template.py).
CONSUMER_REDELIVERY_DAYS = 1 + 4 + 14


# At 50 ms a PutEvents, 32 calls of 10 in flight cap a relay at 6,400 events/s; 16 capped it at 3,200
# and moved 2,300 (docs/performance.md, "Relays at AWS latency").
DEFAULT_PUBLISH_CONCURRENCY = 32
# The publisher's HTTP connection pool holds this many (shop.adapters.aws.events).
MAX_PUBLISH_CONCURRENCY = 50

ORDER_STORES = ("dynamodb", "postgres")  # the template's OrderStore parameter
POSTGRES_RELAYS = ("polling", "logical")  # the template's PostgresRelay parameter
# How a relay sends PutEvents: the SDK client, or the AWS Common Runtime (shop.adapters.eventbridge_crt).
PUBLISH_TRANSPORTS = ("sdk", "crt")


class ConfigurationError(RuntimeError):
    """A required setting is missing or malformed (a deployment mistake, not a request error)."""


def _int(
    env: Mapping[str, str], name: str, default: int, minimum: int = 1, maximum: int | None = None
) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise ConfigurationError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigurationError(f"{name} must be <= {maximum}, got {value}")
    return value


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name) or choices[0]
    if raw not in choices:
        raise ConfigurationError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw


class Settings(NamedTuple):
    """Every setting a function reads from its environment (from_env), parsed once per process. (A NamedTuple,
    as the domain's values are: hashable, a @cache key, and 1.5-2.5 ms cheaper to define than a frozen
    dataclass of 20 fields.)"""

    orders_table_name: str
    inventory_table_name: str
    idempotency_table_name: str
    event_bus_name: str
    notification_topic_arn: str
    relay_poison_queue_url: str
    outbox_ttl_days: int
    max_event_bytes: int
    request_key_ttl_hours: int
    outbox_time_shards: int
    stage: str
    # Where the order service keeps orders, request keys and its outbox (OrderStore), and, for
    # "postgres", the database: host (or a Unix socket directory locally), and the Secrets Manager
    # secret holding its credentials (none locally: trust authentication on the socket).
    order_store: str = "dynamodb"
    database_host: str = ""
    database_port: int = 5432
    database_name: str = "orders"
    database_user: str = "postgres"
    database_secret_arn: str = ""
    # How the postgres store's outbox reaches the bus (PostgresRelay): "polling" (the outbox table, read
    # by FOR UPDATE SKIP LOCKED) or "logical" (its inserts decoded from the write-ahead log).
    postgres_relay: str = "polling"
    # PutEvents calls a relay keeps in flight at once (different orders' chunks; an order's events are
    # never in flight twice). At AWS's tens of milliseconds a call, one at a time caps a relay near
    # 200 events/s; each call counts against the account's PutEvents quota of the region.
    publish_concurrency: int = DEFAULT_PUBLISH_CONCURRENCY
    # "sdk" (boto3) or "crt": the PostgreSQL publisher sends through the AWS Common Runtime, a third of
    # the SDK's CPU a call; the other functions keep the SDK (awscrt's load costs a cold start 65 ms).
    publish_transport: str = "sdk"
    # Lambda sets it; Powertools' idempotency falls back to "test-func" outside Lambda, and so do we
    # (runtime.consumer derives the consumers' pinned idempotency key prefix from it).
    function_name: str = "test-func"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            orders_table_name=env.get("ORDERS_TABLE_NAME", ""),
            inventory_table_name=env.get("INVENTORY_TABLE_NAME", ""),
            idempotency_table_name=env.get("IDEMPOTENCY_TABLE_NAME", ""),
            event_bus_name=env.get("EVENT_BUS_NAME", ""),
            notification_topic_arn=env.get("NOTIFICATION_TOPIC_ARN", ""),
            relay_poison_queue_url=env.get("RELAY_POISON_QUEUE_URL", ""),
            outbox_ttl_days=_int(env, "OUTBOX_TTL_DAYS", 16, minimum=2),
            max_event_bytes=_int(env, "MAX_EVENT_BYTES", EVENTBRIDGE_MAX_ENTRY_BYTES, minimum=1024),
            request_key_ttl_hours=_int(env, "REQUEST_KEY_TTL_HOURS", 24),
            outbox_time_shards=_int(env, "OUTBOX_TIME_SHARDS", 8),
            stage=env.get("STAGE", "dev"),
            order_store=_choice(env, "ORDER_STORE", ORDER_STORES),
            database_host=env.get("DATABASE_HOST", ""),
            database_port=_int(env, "DATABASE_PORT", 5432),
            database_name=env.get("DATABASE_NAME") or "orders",
            database_user=env.get("DATABASE_USER") or "postgres",
            database_secret_arn=env.get("DATABASE_SECRET_ARN", ""),
            postgres_relay=_choice(env, "POSTGRES_RELAY", POSTGRES_RELAYS),
            publish_concurrency=_int(
                env, "PUBLISH_CONCURRENCY", DEFAULT_PUBLISH_CONCURRENCY, maximum=MAX_PUBLISH_CONCURRENCY
            ),
            publish_transport=_choice(env, "PUBLISH_TRANSPORT", PUBLISH_TRANSPORTS),
            function_name=env.get("AWS_LAMBDA_FUNCTION_NAME") or "test-func",
        )

    @property
    def idempotency_expires_after_seconds(self) -> int:
        """How long consumers remember a processed event id (derived: one knob, OutboxTtlDays)."""
        return (self.outbox_ttl_days + CONSUMER_REDELIVERY_DAYS) * DAY_SECONDS

    def require(self, name: str) -> str:
        """Return a string setting that this function cannot work without."""
        if name not in self._fields:  # not getattr alone: a tuple's count and index would answer
            raise AttributeError(f"no setting {name!r}")
        value = getattr(self, name)
        if not value:
            raise ConfigurationError(f"setting {name} ({name.upper()}) is not configured")
        return str(value)


@cache
def get_settings() -> Settings:
    return Settings.from_env()


def trace_header_from_env() -> str | None:
    """The X-Ray trace header Lambda sets for the current invocation (active tracing), if any."""
    return os.environ.get("_X_AMZN_TRACE_ID") or None


def sdk_call_tracing_enabled(env: Mapping[str, str] | None = None) -> bool:
    """TRACE_SDK_CALLS=true: trace each AWS SDK call through Powertools' Tracer (runtime.observability)."""
    env = os.environ if env is None else env
    return env.get("TRACE_SDK_CALLS", "false").lower() == "true"
