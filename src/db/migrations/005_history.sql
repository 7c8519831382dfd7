-- Transaction history (GET /accounts/:accountId/transactions, docs/demo/history.md): an account's
-- transfers newest first, paged by keyset on (created_at, id). An account is on either side of a
-- transfer, so each side has its own index in that order; the page query reads both as two index
-- scans that stop after one page and merges them (Merge Append), whatever the depth of the page.
CREATE INDEX IF NOT EXISTS transfers_from_account_history ON transfers (from_account_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS transfers_to_account_history ON transfers (to_account_id, created_at DESC, id DESC);
