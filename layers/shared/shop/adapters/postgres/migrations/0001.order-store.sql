-- The order store on PostgreSQL: orders, their lines, the API's request keys, the outbox, the inbox.
-- Applied by yoyo-migrations (shop.adapters.postgres.schema); docs/order-database.sql shows the result.
-- Every statement of every migration is safe to run again (IF NOT EXISTS): a run that died after the
-- migration's commit, before yoyo recorded it, leaves it to the next run (shop.adapters.postgres.schema).

CREATE TABLE IF NOT EXISTS orders (
    order_id     text        PRIMARY KEY,
    customer_id  text        NOT NULL,
    currency     text        NOT NULL,
    status       text        NOT NULL CHECK (status IN ('PENDING', 'CONFIRMED', 'REJECTED', 'CANCELLED')),
    version      integer     NOT NULL CHECK (version >= 1),
    total_amount bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS order_lines (
    order_id   text     NOT NULL REFERENCES orders (order_id) ON DELETE CASCADE,
    line_no    smallint NOT NULL,
    sku        text     NOT NULL,
    quantity   integer  NOT NULL CHECK (quantity > 0),
    unit_price bigint   NOT NULL CHECK (unit_price >= 0),
    PRIMARY KEY (order_id, line_no)
);

-- An Idempotency-Key binds one order per caller until expires_at.
CREATE TABLE IF NOT EXISTS request_keys (
    caller          text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     text        NOT NULL,
    order_id        text        NOT NULL REFERENCES orders (order_id),
    response        jsonb       NOT NULL,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (caller, idempotency_key)
);
CREATE INDEX IF NOT EXISTS request_keys_expiry ON request_keys (expires_at);

-- One row per event, immutable but for its publishing state. `envelope` is json, not jsonb: json keeps
-- the text as written, so the bus receives the same bytes from either order store.
CREATE TABLE IF NOT EXISTS outbox (
    position     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     text        NOT NULL UNIQUE,
    aggregate_id text        NOT NULL,
    sequence     integer     NOT NULL CHECK (sequence >= 1),
    event_type   text        NOT NULL,
    envelope     json        NOT NULL,
    trace_header text,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at timestamptz,
    parked_at    timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    UNIQUE (aggregate_id, sequence),
    CHECK (published_at IS NULL OR parked_at IS NULL)
);
-- What the publisher reads: the pending rows, small however large the table grows.
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (aggregate_id, sequence)
    WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_pending_age ON outbox (position)
    WHERE published_at IS NULL AND parked_at IS NULL;
-- Parked rows, counted for their alarm.
CREATE INDEX IF NOT EXISTS outbox_parked ON outbox (position) WHERE parked_at IS NOT NULL;
-- What maintenance deletes, and replay reads by window.
CREATE INDEX IF NOT EXISTS outbox_created ON outbox (created_at);

-- Events a consumer has applied, written in the transaction of the effect.
CREATE TABLE IF NOT EXISTS inbox (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS inbox_processed ON inbox (processed_at);
