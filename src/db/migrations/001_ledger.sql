-- Customers log in with a username; password_hash is scrypt (see src/ledger/passwords.ts).
CREATE TABLE customers (
  id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  username text NOT NULL UNIQUE CHECK (length(username) BETWEEN 1 AND 64),
  password_hash text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- Amounts are integers in the currency's minor unit; the CHECK is the last guard against overdraft.
CREATE TABLE accounts (
  id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  customer_id integer NOT NULL REFERENCES customers (id),
  currency char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
  balance bigint NOT NULL DEFAULT 0 CHECK (balance >= 0),
  opening_balance bigint NOT NULL DEFAULT 0 CHECK (opening_balance >= 0),
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX accounts_customer_id ON accounts (customer_id);

CREATE TABLE transfers (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  customer_id integer NOT NULL REFERENCES customers (id),
  from_account_id integer NOT NULL REFERENCES accounts (id),
  to_account_id integer NOT NULL REFERENCES accounts (id),
  amount bigint NOT NULL CHECK (amount > 0),
  currency char(3) NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  CHECK (from_account_id <> to_account_id)
);

-- Double entry: each transfer writes a debit (negative) and a credit (positive) that sum to zero.
CREATE TABLE ledger_entries (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  transfer_id bigint NOT NULL REFERENCES transfers (id),
  account_id integer NOT NULL REFERENCES accounts (id),
  amount bigint NOT NULL CHECK (amount <> 0),
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_transfer_id ON ledger_entries (transfer_id);
CREATE INDEX ledger_entries_account_id ON ledger_entries (account_id);
