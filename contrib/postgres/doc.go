// Package postgres keeps idemhttp's shared state in PostgreSQL:
// [TxMiddleware], which stores each response in the handler's own
// transaction, so that the business write and the record of its response
// commit together; [Store], an [idemserver.Store] that every instance of a
// service shares; and [Journal], an [idemhttp.Journal] that a fleet of
// batch workers shares, handing out pending operations with leases so that
// a dead worker's operations are resumed by another with the same keys.
//
// It lives in its own module so that idemhttp's core does not depend on
// pgx. Give it a [*pgxpool.Pool] and create the tables once with [Migrate]
// (or apply [Schema] with a migration tool).
//
// # The transactional form: the recommended way on PostgreSQL
//
// When the handler's effects live in the same database, wrap it with a
// [TxMiddleware]: the handler receives the transaction, and the response
// is stored in it and sent after COMMIT:
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db-primary/app")
//	...
//	if err := postgres.Migrate(ctx, pool); err != nil { ... }
//	mw, err := postgres.NewTxMiddleware(ctx, pool, &postgres.TxOptions{Principal: accountOf})
//	...
//	http.Handle("POST /v1/charges", mw.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
//		k, _ := postgres.KeyFromContext(r.Context())
//		_, err := tx.Exec(r.Context(), "INSERT INTO charges (account, idem_key, amount) VALUES ($1, $2, $3)", k.Scope, k.Key, amount)
//		if err != nil { return err } // rolled back; the key is free again
//		w.WriteHeader(http.StatusCreated)
//		return nil
//	}))
//
// [idemserver.Middleware] with a [Store] cannot give this guarantee: it
// stores the response after the handler's own commit, in a statement of
// its own, so a server that dies between the two leaves the effect
// without its record, and the retry after the lock timeout runs it again
// (TestTxCrash shows both). Use the Store for handlers whose effects live
// elsewhere, and call other services with keys derived from the request's
// ([TxKey.DeriveKey]), which also makes such calls from inside a
// [TxMiddleware] handler safe to repeat.
//
// The key is claimed inside the request's transaction, not committed
// first: see [TxMiddleware] for why, and the README for the measurements
// (recovery after a SIGKILL in milliseconds instead of the lock timeout;
// duplicates answered 409 at once, none of them waiting on a lock). Its
// one cost: a server that vanishes without closing its connections (a
// host crash, a partition) keeps its keys until PostgreSQL notices, which
// [TxOptions.IdleTimeout] bounds.
//
// Multi-step handlers that call third parties (Brandur Leach's "atomic
// phases") fit as follows. The single-transaction form is built in: make
// the foreign calls from inside the handler with [TxKey.DeriveKey] keys;
// a rollback, or a crash, makes the retry send them again with the same
// keys, and the other service replays. A handler that must commit between
// phases saves recovery points ([SaveRecoveryPoint], committed at once in
// the idemhttp_recovery table) and, run again after a crash, resumes from
// them ([LoadRecoveryPoint]); the key's advisory lock, held by the
// request's transaction, keeps a second run out meanwhile.
//
// With the non-transactional middleware:
//
//	store, err := postgres.NewStore(ctx, pool)
//	if err != nil {
//		log.Fatal(err)
//	}
//	mw := &idemserver.Middleware{Store: store, Principal: accountOf}
//
// The tables (idemhttp_keys and idemhttp_journal) go into the first schema
// on the connection's search_path: to keep two applications apart in one
// database, give each a schema and set search_path in its connection
// string (?search_path=billing). Their keys, claims and locks never meet:
// TxMiddleware's advisory locks, which belong to the whole database, are
// taken on a hash of the key and of its table's schema-qualified name.
//
// TxMiddleware works at every isolation level ([TxOptions].IsoLevel, or the
// server's default): a duplicate gets the stored response or 409, never a
// 500, and a transaction that fails with a serialization failure or a
// deadlock is answered 503 with Retry-After, its key free, or run again
// ([TxOptions].SerializationRetries). A handler that ends the transaction
// itself (COMMIT or ROLLBACK as a statement) never gets a 2xx stored or
// sent, and its key is kept; see [TxMiddleware].
//
// # The primary only
//
// Claims and the reads that follow them must go to the primary, never to a
// read replica, and the pool given to [NewTxMiddleware], [NewStore] and
// [NewJournal] must be connected to it. [NewTxMiddleware] refuses a
// standby with [ErrStandby]; [CheckPrimary] makes the same check for the
// others. Never put a pooler that routes reads to replicas in front of
// these statements; a pooler in transaction mode (PgBouncer's
// pool_mode = transaction) is fine, since every statement of a request
// runs in one transaction, and TxMiddleware's advisory lock is
// transaction-scoped; configure the pool as pgx needs for it (a
// QueryExecMode that keeps no statement prepared, unless the pooler keeps
// them, as PgBouncer 1.21 and later do with max_prepared_statements):
// TxMiddleware's own statements follow the pool's mode. Replication is asynchronous: a replica that lags by a few
// milliseconds does not yet have a claim or a response the primary has
// committed, so a client's fast retry that read from it would find the key
// free and run the effect a second time. (Claim starts with an INSERT,
// which a hot standby refuses, so a pool on a standby fails loudly rather
// than silently; a pool that routes only SELECTs to replicas, as some
// proxies do, is the dangerous case.)
//
// # The store
//
// One row per key: an in-progress claim, or the completed response. Claim
// is INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE the existing row has
// expired, followed in the same pipeline and implicit transaction by a
// SELECT of the row that was left alone, so one round trip decides
// Claimed, InProgress or Completed. Complete and Release are an UPDATE
// and a DELETE that match the claim's token and a live lock. Time is the
// database's now(), so the servers' clocks need not agree. Expired rows are
// invisible at once; [Store.Prune] deletes them.
//
// Every statement is resent, on a fresh connection, when its connection
// turns out dead before it ran (a server restart, pg_terminate_backend, a
// failover), so a restart costs the requests in flight a few milliseconds
// rather than a 503 or an unstored response. While the server is
// unreachable, Claim fails and the middleware answers 503 with
// Retry-After, within the lock timeout. A response whose Complete fails is
// still sent to its caller; the middleware tries the Complete again while
// the claim's lock is live, and pins the claim for the TTL should the
// database answer that, so that the key answers 409 rather than run again;
// only an outage that outlasts the lock leaves the key to expire (then a
// retry runs it again). Every statement names the key table [NewStore]
// found, so a session SET search_path left on a pooled connection never
// moves a record.
//
// # Formats and upgrades
//
// The key table is a persisted format, version 1 (idemhttp_schema, which
// [Migrate] keeps; a table of a newer release is refused with
// [ErrNewerSchema]), and so are the records in it (idemserver's, versioned
// by their first byte) and the fingerprints (see idemserver). [Migrate]
// upgrades the tables of every earlier release in place; testdata/baseline
// holds those the release before this one left, and TestBaseline replays
// every key they stored, in both modes. Instances of that release and of
// this one side by side: see docs/server.md, "Formats and upgrades", at the
// repository's root (the fingerprints to set during the rollout, and why
// the key table's primary key keeps it safe although their advisory locks
// differ).
//
// # The journal and the worker loop
//
// A batch is loaded into the journal as pending entries, by a producer with
// [Journal.Enqueue] or by the workers' own [idemhttp.Client.Do] calls
// (which [Journal.Begin] leases to the calling worker). Each worker then
// loops: [Journal.ClaimPending] leases it the oldest entries no live lease
// holds (SELECT ... FOR UPDATE SKIP LOCKED, so workers never wait for each
// other), and it resends them through an [idemhttp.Client] whose Journal
// is the same Journal, with their own keys, operation ids and bodies; the
// client records each outcome, which ends the lease:
//
//	j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "worker-7"})
//	client := &idemhttp.Client{Journal: j, PrepareRequest: addCredentials}
//	for {
//		entries, err := j.ClaimPending(ctx, 16)
//		if err != nil { return err } // ErrClockJump: the clock was set back; a person decides
//		if len(entries) == 0 { /* none free: stop when Pending is empty, else wait */ }
//		results, err := client.Resume(ctx, &idemhttp.ResumeOptions{Entries: entries})
//		...
//	}
//
// A worker that dies (or hangs) keeps its entries until their leases
// expire; then another worker claims them and resends them with the same
// keys, and the server either replays the stored response or runs the
// operation for the first time. A worker that outlives its lease and sends
// at the same time as its successor is safe too (one of them gets a 409 or
// a replay): correctness rests on the keys. Leases are reckoned by the
// database's clock: one set back by d (a failover to a host whose clock is
// behind) lengthens the leases it finds by d, so a dead worker's entries
// wait that much longer for another: a delay, never a second send.
// [idemhttp.Client.Resume] without Entries in a fleet claims what it
// resends (ClaimPending, all it can), so it skips the entries other
// workers hold.
//
// # Fencing: nobody undoes another worker's entry
//
// Every write is fenced, so that a stale worker (one whose lease expired,
// or whose PrepareRequest stalled while another worker took the entry)
// never removes, revives or overwrites what another holds or has
// finished. Every refusal changes nothing and wraps [idemhttp.ErrFenced]:
//
//   - Done and abandoned are final: a [Journal.Finish] in the other state
//     is refused; one in the same state (a second sender that got the
//     replay) only adds its attempts.
//   - Finish of a pending entry that another worker's live lease holds is
//     refused with a [*LeaseLostError] ([ErrLeaseLost]): the holder's
//     outcome counts.
//   - [Journal.Delete], with which a Client withdraws an entry its own call
//     began and never sent, removes only a pending entry this Journal
//     holds with no attempt recorded. It refuses a done or abandoned
//     entry, and a pending one that another worker has claimed or begun
//     since, live lease or not, or that nobody holds: another worker may
//     have sent it (an abandoned entry too, before it was abandoned), and
//     withdrawing it would make a rerun mint a new key and run the
//     operation twice. [Journal.Forget] is the operator's removal of an
//     entry a person has resolved.
//   - [Journal.Renew] extends only this worker's own lease.
//
// Every worker that sends an entry holds it first: [Journal.ClaimPending]
// leases it, and so does [Journal.Begin] when it finds a pending entry
// with the same fingerprint (the caller, which ran the same operation, is
// about to send it). Each Journal has a token of its own, so workers that
// share a name are still told apart.
//
// # One clock for the fleet
//
// Entries are aged by one clock, the database's now() (or
// [JournalOptions.Clock], for tests that simulate time), never by the
// workers' own, which drift. [Journal.Now] returns it; an [idemhttp.Client]
// that sees Now leaves the entries' times for the journal to stamp and
// ages them by Now, so that neither a database clock ahead of a worker
// (an entry past the server's retention resent) nor a worker's ahead of
// the database (a done entry pruned at once and its operation run again)
// can make an operation run twice. A time given with an entry (one moved
// from another journal) is kept, but never later than the clock.
// [Journal.ClaimPending] hands out no entry older than the retention the
// worker's Client told the journal ([Journal.Retain]: its
// idemhttp.Policy.Retention, the one retention setting) by that clock: it
// marks it abandoned, for a person or a reconciliation step (list them
// with SELECT ... WHERE state = 'abandoned'). Until a Client told it, it
// hands every entry out, and the Client's Resume abandons those past its
// retention.
//
// [Journal.HighWater] is the latest time the journal ever recorded, kept
// in the one-row idemhttp_journal_clock table so that it outlives pruned
// entries. A database restored or failed over to a host whose clock is
// behind shows as a clock below the mark: the client then neither resends
// nor reuses an entry, and ClaimPending claims nothing
// ([idemhttp.ErrClockJump]), since no entry's age is known. The mark is
// raised by each process at most every few seconds (a write to one row in
// every transaction would serialise the fleet's commits), so a jump is
// seen by every worker once it exceeds [idemhttp.ClockTolerance] by those
// seconds. A set-back shows only while the clock is below the mark; a
// downtime carries it past, and entries then look younger than they are.
// So a worker that sees it records the mark as the fleet's doubt
// ([Journal.ClockDoubt], in idemhttp_journal_clock.doubt), for good: the
// entries created up to it are of unknown age, and a Client resends,
// reuses and refetches none of them, however far the clock moves on.
// Nothing tells how far a set-back went when nobody looked while the
// clock was below the mark (no write, no claim, no resend in the window):
// then the jump goes unseen.
//
// A done outcome's [idemhttp.Result] (a bounded copy of the final
// response: the headers a caller reads, never Set-Cookie, with the URLs
// they hold redacted, as [idemhttp.Outcome.Sanitized] keeps them for
// every journal) is kept with the entry, in the result column, and
// returned by [Journal.Get] and by a Begin that finds the entry.
//
// Credentials never reach the table: Authorization, Cookie,
// Proxy-Authorization, API keys under their common names (X-Api-Key and
// the others [idemhttp.Entry.Sanitized] lists), the names in
// [JournalOptions.SecretHeaders] and those in
// [idemhttp.Client.SecretHeaders] are stripped, and an entry whose URL carries a user part or a secret
// query value is refused when it is written, whatever way it comes in
// ([idemhttp.Entry.Sanitized]), rather than stored as an entry every
// resend of which would fail. Add credentials in
// [idemhttp.Client.PrepareRequest].
//
// # Upgrading the journal
//
// The journal's format is the idemhttp_journal table of [Schema]'s version
// (the comment at its top; version 7 adds idemhttp_journal_clock.doubt,
// version 4 not_before, version 3 result and idemhttp_journal_clock) plus the result column's own encoding, which
// starts with a version byte. [Migrate] upgrades an older table in place,
// with ADD COLUMN IF NOT EXISTS: rows written before read as they were
// (no kept result, no not-before), and resume and replay as before. A
// table written by the previous release is in testdata, and
// TestJournalBaselineGolden migrates it and resends its pending entries
// under their own keys.
//
// Old and new workers side by side, after Migrate: an old worker ignores
// not_before, so it may claim and resend a parked entry before the
// server's time, under the same key (the server answers 429 again, or
// runs it once: never twice), and it records no not-before of its own.
// Nothing either writes stops the other from reading a row. An old worker
// (commit 2d053bb) withdraws as it did, by key alone, whatever the entry's
// state or lease (an abandoned entry, one nobody holds, one a new worker
// leased and sent, a done one), so a call of its that stalled before its
// first attempt past another worker's send can still reopen the operation
// under a new key; its Begin takes no lease of an entry it finds and
// sends, so a new worker's withdrawal (its own lease, nothing recorded)
// does not see that send and can reopen the operation too; and it ignores
// the clock's doubt, resending entries a new worker would refuse. Both
// holes close once every worker runs this release. Migrate before
// starting new workers; a worker of a release older than the table it
// meets sees columns it does not read, and writes rows the new one reads.
//
// # Durability
//
// A method returns after its transaction commits; with PostgreSQL's
// default synchronous_commit = on, that is after the WAL reached the
// primary's disk. Lowering synchronous_commit for these tables trades
// that for speed: a crash of the database can then forget claims and
// responses already answered, and their retries run the effect again.
package postgres
