-- Postgres is the final guard for Idempotency-Key on transfers: the key, the request fingerprint
-- and the response are written in the same transaction as the money movement, and the unique
-- constraint makes a second transfer with one key impossible even when Redis lost its record.
-- Transfers made without a key (NULL) are not constrained.
ALTER TABLE transfers ADD COLUMN idempotency_key text CHECK (length(idempotency_key) BETWEEN 1 AND 255);
ALTER TABLE transfers ADD COLUMN request_fingerprint text;
ALTER TABLE transfers ADD COLUMN response jsonb;
ALTER TABLE transfers ADD CONSTRAINT transfers_customer_idempotency_key UNIQUE (customer_id, idempotency_key);
ALTER TABLE transfers ADD CONSTRAINT transfers_idempotency_complete CHECK (
  (idempotency_key IS NULL) = (request_fingerprint IS NULL) AND (idempotency_key IS NULL) = (response IS NULL)
);
