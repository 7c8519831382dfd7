-- The database's identity: a random name made when the database is created. The gateway puts every
-- Redis key derived from this database's ids under it (docs/demo/operations.md, "Restoring the
-- database"), so a new database (an embedded one at each start, or a new server) never meets the
-- keys of another. A backup keeps the identity it had; the gateway gives a database restored from
-- an older backup a new one (src/db/identity.ts).
CREATE TABLE database_identity (
  single boolean PRIMARY KEY DEFAULT true CHECK (single),
  identity text NOT NULL
);
INSERT INTO database_identity (identity) VALUES (left(replace(gen_random_uuid()::text, '-', ''), 12));
