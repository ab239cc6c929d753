-- Why the inventory refused a REJECTED order, as the API shows it ({"reason": ..., "lines": [...]}; the
-- order repository writes it with the REJECTED transition). NULL on every other order, and on orders
-- rejected before it was kept: adding a nullable column without a default rewrites nothing.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS rejection jsonb;
-- NOT VALID: every existing row has it NULL, so it holds already; a validating scan would hold the orders'
-- ACCESS EXCLUSIVE lock for as long as a scan of every order takes. Rows written from now on are checked.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'orders'::regclass AND conname = 'orders_rejection_only_when_rejected') THEN
        ALTER TABLE orders ADD CONSTRAINT orders_rejection_only_when_rejected
            CHECK (rejection IS NULL OR status = 'REJECTED') NOT VALID;
    END IF;
END $$;
