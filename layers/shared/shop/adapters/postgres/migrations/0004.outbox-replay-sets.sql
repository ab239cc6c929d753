-- Replays and handovers the logical relay (PostgresRelay=logical) drains chunk by chunk
-- (shop.adapters.postgres.replays): a replay, the handover of the rows the polling publisher had not
-- published, or a transaction too large for one round ("spill"). The rows a set still names are its
-- pending rows: each leaves the set in the relay transaction that put it on the bus or parked it, so
-- progress survives a crash and a set of any size goes out across rounds. A set's message in the log
-- (pg_logical_emit_message, naming the set) activates it once the slot is past everything before it;
-- the slot then moves on at once, and later events keep flowing while the set drains.
CREATE TABLE IF NOT EXISTS outbox_replay (
    replay_id    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('replay', 'handover', 'spill')),
    -- A spilled transaction's end in the log: the same transaction read again records nothing twice.
    source_lsn   pg_lsn      UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    activated_at timestamptz,  -- the relay read the set's message: every row committed before it is out
    finished_at  timestamptz,  -- activated and no row pending
    CHECK (finished_at IS NULL OR activated_at IS NOT NULL)
);
-- The pending rows. The foreign key keeps retention from deleting a row a set still names.
CREATE TABLE IF NOT EXISTS outbox_replay_rows (
    replay_id bigint NOT NULL REFERENCES outbox_replay ON DELETE CASCADE,
    position  bigint NOT NULL REFERENCES outbox (position),
    PRIMARY KEY (replay_id, position)
);
CREATE INDEX IF NOT EXISTS outbox_replay_rows_position ON outbox_replay_rows (position);
