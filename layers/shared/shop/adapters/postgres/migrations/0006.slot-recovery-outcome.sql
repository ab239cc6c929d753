-- How many gap rows a slot recovery's hand-over left out (created before the republish window, without
-- includeExpired), kept with the recovery (shop.adapters.postgres.slot_recovery): every recover-slot run
-- that reports on the recovery reports them, not only the run that handed the gap over.
ALTER TABLE outbox_slot
    ADD COLUMN recovery_expired integer,
    ADD CONSTRAINT outbox_slot_recovery_expired
        CHECK (recovery_expired IS NULL OR recovery_handed_over_at IS NOT NULL);
