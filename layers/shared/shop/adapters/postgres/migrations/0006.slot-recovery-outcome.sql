-- How many gap rows a slot recovery's hand-over left out (created before the republish window, without
-- includeExpired), kept with the recovery (shop.adapters.postgres.slot_recovery): every recover-slot run
-- that reports on the recovery reports them, not only the run that handed the gap over.
-- No CHECK tying it to recovery_handed_over_at: the code of the release before this one (a rollback, an
-- earlier release deployed again) clears a recovery without knowing this column, and would be refused.
ALTER TABLE outbox_slot ADD COLUMN IF NOT EXISTS recovery_expired integer;
