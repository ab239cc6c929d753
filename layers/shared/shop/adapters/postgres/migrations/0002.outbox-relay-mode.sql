-- Which relay reads the outbox (PostgresRelay): the mode the rows' publishing state was last handed over
-- to. The migration function switches it, with the slot (shop.adapters.postgres.relay_mode).
CREATE TABLE IF NOT EXISTS outbox_relay (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    mode       text        NOT NULL CHECK (mode IN ('polling', 'logical')),
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO outbox_relay (mode) VALUES ('polling') ON CONFLICT (singleton) DO NOTHING;
