-- An outbox row is written only by its transfer's own statement, from the accounts that statement
-- just locked and the transfer row it just inserted: its references are right by construction.
-- Checking them again cost each transfer five lookups (and KEY SHARE locks on both customers).
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_transfer_id_fkey;
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_from_customer_id_fkey;
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_to_customer_id_fkey;
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_from_account_id_fkey;
ALTER TABLE outbox_events DROP CONSTRAINT IF EXISTS outbox_events_to_account_id_fkey;
