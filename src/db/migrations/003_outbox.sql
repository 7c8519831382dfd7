-- Transactional outbox: the transfer's own statement inserts its event here, in the same
-- transaction as the money movement, so an event exists exactly when its transfer committed.
-- Relays (every gateway instance) claim unrelayed rows with FOR UPDATE SKIP LOCKED, append them
-- to the Redis stream and set relayed_at in the same transaction (see docs/demo/events.md).
CREATE TABLE outbox_events (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  type text NOT NULL,
  transfer_id bigint NOT NULL REFERENCES transfers (id),
  from_customer_id integer NOT NULL REFERENCES customers (id),
  to_customer_id integer NOT NULL REFERENCES customers (id),
  from_account_id integer NOT NULL REFERENCES accounts (id),
  to_account_id integer NOT NULL REFERENCES accounts (id),
  amount bigint NOT NULL,
  currency char(3) NOT NULL,
  occurred_at timestamptz NOT NULL,
  relayed_at timestamptz
);
-- What relays scan: only the backlog, oldest first.
CREATE INDEX outbox_events_unrelayed ON outbox_events (id) WHERE relayed_at IS NULL;
