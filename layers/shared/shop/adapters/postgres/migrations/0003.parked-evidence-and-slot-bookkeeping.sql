-- Parked rows are evidence: retention keeps a parked row until an operator redrives it (redriven_at;
-- its parked mark is cleared, and the row is published again) or discards it, saying who and why
-- (python -m operations redrive-poison | discard-poison; shop.adapters.postgres.parked).
ALTER TABLE outbox
    ADD COLUMN IF NOT EXISTS redriven_at    timestamptz,
    ADD COLUMN IF NOT EXISTS discarded_at   timestamptz,
    ADD COLUMN IF NOT EXISTS discarded_by   text,
    ADD COLUMN IF NOT EXISTS discard_reason text;
-- NOT VALID: every existing row has the new columns NULL, so it holds already; a validating scan would
-- hold the outbox's ACCESS EXCLUSIVE lock for as long as the scan of a table of weeks of rows takes.
-- Rows written or updated from now on are checked.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'outbox'::regclass AND conname = 'outbox_discard_recorded') THEN
        ALTER TABLE outbox ADD CONSTRAINT outbox_discard_recorded CHECK (
            (discarded_at IS NULL AND discarded_by IS NULL AND discard_reason IS NULL)
            OR (discarded_at IS NOT NULL AND parked_at IS NOT NULL
                AND coalesce(discarded_by, '') <> '' AND coalesce(discard_reason, '') <> '')
        ) NOT VALID;
    END IF;
END $$;

-- What the database knows of its outbox slot beyond PostgreSQL's catalogue, for the day the slot is lost
-- (a writer replaced, an invalidation; shop.adapters.postgres.slot_recovery):
-- - delivered_before: every outbox row committed before this time had been delivered by the slot (the
--   commit time of the oldest transaction it still held, or the time it held none), recorded by the
--   maintenance function each minute; where the republishing of a lost slot's gap starts;
-- - recovery_since / recovery_started_at: a recovery under way (set before the slot is recreated);
--   recovery_replay_id: the replay set (outbox_replay) the gap was handed to; the recovery is over once
--   that set is drained, and the row's recovery columns are cleared.
CREATE TABLE IF NOT EXISTS outbox_slot (
    slot_name           text        PRIMARY KEY,
    delivered_before    timestamptz,
    delivered_at        timestamptz,
    recovery_since      timestamptz,
    recovery_started_at timestamptz,
    recovery_handed_over_at timestamptz,
    recovery_replay_id  bigint,
    CHECK ((recovery_since IS NULL) = (recovery_started_at IS NULL)),
    CHECK (recovery_handed_over_at IS NULL OR recovery_since IS NOT NULL),
    CHECK (recovery_replay_id IS NULL OR recovery_handed_over_at IS NOT NULL)
);
