-- outbox_events holds only the backlog: relaying an event deletes its row (in the transaction that
-- appends it to the stream). Marking relayed rows in place (relayed_at, set by UPDATE) wrote a second
-- version of every row, and of its primary-key entry, beside the pages the transfers insert into. The
-- history a refill of the stream needs after Redis lost entries is the transfers table itself: an
-- event's id is its transfer's id, and transfers.has_event says which transfers wrote an event (not
-- those made with OUTBOX=off).
ALTER TABLE transfers ADD COLUMN has_event boolean NOT NULL DEFAULT false;
UPDATE transfers SET has_event = true WHERE id IN (SELECT transfer_id FROM outbox_events);
DELETE FROM outbox_events WHERE relayed_at IS NOT NULL;
ALTER TABLE outbox_events DROP COLUMN relayed_at;
ALTER TABLE outbox_events ALTER COLUMN id DROP IDENTITY IF EXISTS;
-- Renumbered through negatives, so no row takes an id another row still holds.
UPDATE outbox_events SET id = -transfer_id;
UPDATE outbox_events SET id = -id;
