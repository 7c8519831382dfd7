-- Transfers scheduled for later. Postgres holds every schedule and its status (the source of
-- truth); Redis holds only the queue that wakes a worker when one is due. A schedule runs in the
-- transaction that moves the money: its row is locked FOR UPDATE and its status checked there, so a
-- second run of one schedule, or a cancel racing its run, finds it finished and moves nothing.
CREATE TABLE scheduled_transfers (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  customer_id integer NOT NULL REFERENCES customers (id),
  from_account_id integer NOT NULL REFERENCES accounts (id),
  to_account_id integer NOT NULL REFERENCES accounts (id),
  amount bigint NOT NULL CHECK (amount > 0),
  currency char(3) NOT NULL,
  run_at timestamptz NOT NULL,
  status text NOT NULL DEFAULT 'scheduled'
    CHECK (status IN ('scheduled', 'running', 'completed', 'failed', 'cancelled')),
  -- The one transfer a completed schedule made; unique, so no two schedules claim one transfer.
  transfer_id bigint UNIQUE REFERENCES transfers (id),
  -- Why a failed schedule failed: the problem's type slug, title and detail.
  failure jsonb,
  attempts integer NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  CHECK (from_account_id <> to_account_id),
  CHECK ((status = 'completed') = (transfer_id IS NOT NULL)),
  CHECK ((status = 'failed') = (failure IS NOT NULL))
);
CREATE INDEX scheduled_transfers_customer ON scheduled_transfers (customer_id, id);
-- The reconciler's scan: schedules not yet finished, by due time.
CREATE INDEX scheduled_transfers_pending ON scheduled_transfers (run_at) WHERE status IN ('scheduled', 'running');

-- Each run of the end-of-day reconciliation: who ran it (instance and the lock's fencing token),
-- when, and what it found. A run is recorded only with a token above every earlier run's.
CREATE TABLE reconciliation_runs (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  instance_id text NOT NULL,
  fence bigint NOT NULL UNIQUE,
  started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  finished_at timestamptz,
  result text CHECK (result IN ('ok', 'violations', 'error')),
  violation_count integer,
  violations jsonb,
  CHECK ((finished_at IS NULL) = (result IS NULL))
);
CREATE INDEX reconciliation_runs_started_at ON reconciliation_runs (started_at);
