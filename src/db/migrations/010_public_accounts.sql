-- Public accounts publish their movements (a relief fund, a campaign): an account with a public
-- name is one. Customers follow them; a customer's feed shows the movements of those they follow.
ALTER TABLE accounts ADD COLUMN public_name text CHECK (length(public_name) BETWEEN 1 AND 100);
CREATE TABLE follows (
  customer_id integer NOT NULL REFERENCES customers (id),
  account_id integer NOT NULL REFERENCES accounts (id),
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (customer_id, account_id)
);
-- Follower counts of a public account.
CREATE INDEX follows_account_id ON follows (account_id);
