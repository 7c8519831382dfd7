-- Postgres is the final guard for Idempotency-Key on scheduled transfers, as on transfers: the key,
-- the request fingerprint and the 201 response are written with the schedule, and the unique
-- constraint makes a second schedule with one key impossible even when Redis lost its record.
-- Schedules made without a key (NULL) are not constrained.
ALTER TABLE scheduled_transfers ADD COLUMN idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 255);
ALTER TABLE scheduled_transfers ADD COLUMN request_fingerprint text;
ALTER TABLE scheduled_transfers ADD COLUMN response jsonb;
ALTER TABLE scheduled_transfers ADD CONSTRAINT scheduled_transfers_customer_idempotency_key UNIQUE (customer_id, idempotency_key);
ALTER TABLE scheduled_transfers ADD CONSTRAINT scheduled_transfers_idempotency_complete CHECK (
  (idempotency_key IS NULL) = (request_fingerprint IS NULL) AND (idempotency_key IS NULL) = (response IS NULL)
);
-- The cap on pending schedules counts a customer's unfinished ones.
CREATE INDEX scheduled_transfers_customer_pending ON scheduled_transfers (customer_id) WHERE status IN ('scheduled', 'running');
