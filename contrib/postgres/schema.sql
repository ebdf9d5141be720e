-- Schema of github.com/idemkit/idemhttp/contrib/postgres, version 7: version 1
-- plus idemhttp_journal.lease_token and the idemhttp_recovery table (version
-- 2), plus idemhttp_journal.result and the idemhttp_journal_clock table
-- (version 3), plus idemhttp_journal.not_before (version 4), plus the
-- idemhttp_schema table (version 5), plus idemhttp_inbox.format and the
-- idemhttp_inbox_ledger table (version 6), plus idemhttp_journal_clock.doubt
-- (version 7). Applying it to an older database
-- upgrades it in place (TestBaseline applies it to the tables of the release
-- at commit 2d053bb, in testdata/baseline).
--
-- Migrate applies this file in one transaction under an advisory lock. Every
-- statement is idempotent, so it may also be applied by hand (psql -f
-- schema.sql) or copied into a migration tool. The tables go into the first
-- schema on the connection's search_path; to keep several stores apart in
-- one database, give each its own schema and search_path.

-- idemhttp_keys holds the records of Store, the idemserver.Store: one row per
-- key, either an in-progress claim (record IS NULL) or a completed response.
-- Keys, tokens and fingerprints are opaque byte strings to the store (the
-- middleware folds the principal's scope into the key), hence bytea: text
-- could hold neither NUL nor invalid UTF-8.
CREATE TABLE IF NOT EXISTS idemhttp_keys (
    key         bytea       PRIMARY KEY,
    token       bytea       NOT NULL,  -- the token of the request that claimed the key
    fingerprint bytea       NOT NULL,  -- the first claimer's request fingerprint
    record      bytea,                 -- the stored response once completed; NULL while in progress
    expires_at  timestamptz NOT NULL   -- lock expiry while in progress, TTL expiry once completed
);

-- Store.Prune deletes by expiry without reading the whole table.
CREATE INDEX IF NOT EXISTS idemhttp_keys_expires_at ON idemhttp_keys (expires_at);

-- idemhttp_schema records the version of each part's persisted format, so
-- that a release can tell a table laid out by a newer one (and refuse to
-- start, rather than misread it) from one of its own or an older one.
-- Added in schema version 5; a table without its row is at version 1, the
-- first. keys: idemhttp_keys (key, token, fingerprint, record, expires_at:
-- a claim while record IS NULL, else idemserver's record, versioned by its
-- first byte), unchanged since version 1; TxMiddleware writes its claim row
-- in the request's transaction since this release, which an instance of
-- the previous release reads as a claim in progress.
CREATE TABLE IF NOT EXISTS idemhttp_schema (
    component text    PRIMARY KEY,
    version   integer NOT NULL
);
INSERT INTO idemhttp_schema (component, version) VALUES ('keys', 1)
ON CONFLICT (component) DO UPDATE SET version = greatest(idemhttp_schema.version, excluded.version);

-- idemhttp_journal holds the entries of Journal, an idemhttp.Journal shared
-- by a fleet of workers. Keys and operation ids are printable ASCII (the
-- journal validates them), so text.
CREATE TABLE IF NOT EXISTS idemhttp_journal (
    key              text        PRIMARY KEY,
    operation        text,                            -- NULL when the entry has none
    method           text        NOT NULL,
    url              text        NOT NULL,            -- without any password
    header           jsonb       NOT NULL DEFAULT '{}', -- never Authorization, Cookie, Proxy-Authorization
    body             bytea,                           -- NULL when not stored; '' when stored and empty
    fingerprint      text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('pending', 'done', 'abandoned')),
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_status      integer     NOT NULL DEFAULT 0,
    lease_owner      text,                            -- the worker holding the entry, if any
    lease_expires_at timestamptz                      -- when the lease ends; NULL when not leased
);

-- lease_token identifies the Journal (one per worker process) holding the
-- lease, so that Finish and Renew are fenced even when worker names repeat.
-- Added after version 1; ADD COLUMN IF NOT EXISTS upgrades older tables.
ALTER TABLE idemhttp_journal ADD COLUMN IF NOT EXISTS lease_token text;

-- result holds a done entry's kept response (idemhttp.Result: status,
-- headers, body) in the journal's own binary encoding; NULL for none.
-- Added in version 3.
ALTER TABLE idemhttp_journal ADD COLUMN IF NOT EXISTS result bytea;

-- not_before holds a pending entry's earliest next send, by the journal's
-- clock (idemhttp.Entry.NotBefore: the time the server asked for with
-- Retry-After, when a call parked the operation); NULL for none, as every
-- row of an older table reads. ClaimPending skips a row until then. Added in
-- version 4.
ALTER TABLE idemhttp_journal ADD COLUMN IF NOT EXISTS not_before timestamptz;

-- idemhttp_journal_clock holds the journal's high-water mark: the latest time
-- the journal recorded, kept when the entries holding it are pruned, so that
-- a clock set back is seen (Journal.HighWater). One row. Added in version 3;
-- an older table's mark starts at its latest time (the scan runs only while
-- the row is missing).
CREATE TABLE IF NOT EXISTS idemhttp_journal_clock (
    id   integer     PRIMARY KEY CHECK (id = 1),
    high timestamptz NOT NULL
);
INSERT INTO idemhttp_journal_clock (id, high)
SELECT 1, s.high FROM (
    SELECT max(greatest(created_at, updated_at)) AS high FROM idemhttp_journal
    WHERE NOT EXISTS (SELECT 1 FROM idemhttp_journal_clock)) s
WHERE s.high IS NOT NULL
ON CONFLICT (id) DO NOTHING;
-- doubt is the mark when a Journal found the clock set back below it
-- (Journal.ClockDoubt): entries created at or before it are of unknown age,
-- for good. NULL for none, as an older table's row reads. Added in version
-- 7; a worker of an older release ignores it.
ALTER TABLE idemhttp_journal_clock ADD COLUMN IF NOT EXISTS doubt timestamptz;

-- One key per operation. NULLs are distinct, so entries without an
-- operation never conflict here.
CREATE UNIQUE INDEX IF NOT EXISTS idemhttp_journal_operation ON idemhttp_journal (operation);

-- Pending and ClaimPending read pending entries oldest first; Prune reads
-- done entries by age. Partial indexes stay small however many done
-- entries the retention keeps.
CREATE INDEX IF NOT EXISTS idemhttp_journal_pending ON idemhttp_journal (created_at, key) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS idemhttp_journal_done ON idemhttp_journal (updated_at) WHERE state = 'done';

-- idemhttp_recovery holds the recovery points of TxMiddleware handlers that
-- commit between phases (SaveRecoveryPoint): one row per store key and step.
-- The key is the idemhttp_keys key of the request.
CREATE TABLE IF NOT EXISTS idemhttp_recovery (
    key        bytea       NOT NULL,
    step       text        NOT NULL,
    data       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, step)
);

-- idemhttp_inbox holds the ids of the messages Inbox (and inbox.SQL, which
-- uses the same table) has processed: one row per (consumer, message id),
-- inserted in the transaction of the message's effect. Ids are text as
-- inbox.StoredID gives them (long or binary ids hashed). processed_at is
-- Unix microseconds, read only by Prune.
CREATE TABLE IF NOT EXISTS idemhttp_inbox (
    consumer     text   NOT NULL,
    id           text   NOT NULL,
    processed_at bigint NOT NULL,
    PRIMARY KEY (consumer, id)
);
-- Prune finds old ids by processed_at. Rows arrive roughly in processed_at
-- order, so a BRIN index (a few pages, next to nothing to maintain per
-- insert) serves it; a B-tree would cost every message a second index
-- insert. (inbox.SQL's own Migrate creates a B-tree, the index SQLite has.)
CREATE INDEX IF NOT EXISTS idemhttp_inbox_processed_at ON idemhttp_inbox USING brin (processed_at);
-- format says which release wrote the row: 1, the default, is the previous
-- release's (every id of a consumer in one space, under its plain name), and
-- so is a row an instance of it writes during a rolling deploy; 2 is this
-- one's (ids per id space, and for a message with one, its legacy row too).
-- Added in place: a constant default rewrites nothing.
ALTER TABLE idemhttp_inbox ADD COLUMN IF NOT EXISTS format smallint NOT NULL DEFAULT 1;
-- The inbox's rows are at format 2 from this release on (idemhttp_schema).
INSERT INTO idemhttp_schema (component, version) VALUES ('inbox', 2)
ON CONFLICT (component) DO UPDATE SET version = greatest(idemhttp_schema.version, excluded.version);

-- idemhttp_inbox_ledger holds the inbox's record of each message's handler
-- runs (Inbox.Ledger, inbox.SQLLedger): the runs that failed, and the runs
-- begun and never ended (the process died in them), from which the message
-- core decides when a message is dead-lettered, never from a broker's
-- delivery counter. A row exists only for a message that failed or was
-- redelivered; it goes when the message is settled. format is 1.
CREATE TABLE IF NOT EXISTS idemhttp_inbox_ledger (
    consumer   text     NOT NULL,
    id         text     NOT NULL,
    failures   integer  NOT NULL DEFAULT 0,
    running    integer  NOT NULL DEFAULT 0,
    updated_at bigint   NOT NULL,
    format     smallint NOT NULL DEFAULT 1,
    PRIMARY KEY (consumer, id)
);

-- idemhttp_outbox holds the messages Outbox.Add wrote in business
-- transactions until Outbox.Relay has published them (then it deletes
-- them). seq orders them; id is the stable message id the relay sends.
CREATE TABLE IF NOT EXISTS idemhttp_outbox (
    seq        bigserial   PRIMARY KEY,
    id         text        NOT NULL UNIQUE,
    topic      text        NOT NULL,
    key        bytea,
    body       bytea,
    header     jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
