-- The transfer events whose notifications the notifier appended: its record of "already notified"
-- that outlives Redis. After Redis lost its data, the relay puts the recent events back on the
-- stream; the notifier skips the ones listed here instead of showing customers the same transfer
-- again. Rows older than the relay's refill reach are pruned by the notifier.
CREATE TABLE notified_events (
  event_id bigint PRIMARY KEY,
  notified_at timestamptz NOT NULL DEFAULT now()
);
