-- When a published or parked row became pending again (a replay's reset, a parked row's redrive): the
-- polling outbox's pending age (shop.adapters.postgres.maintenance) counts from it, not from created_at,
-- so a replay of an old window reads as the time the publisher has had for it, not as the window's age
-- (outbox-pending-age would page "publisher behind or stopped" for the replay's whole duration).
-- Nullable, no CHECK: a row never made pending again has none, and the release before this one (a
-- rollback, an earlier release deployed again) writes rows without knowing the column.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS pending_since timestamptz;
