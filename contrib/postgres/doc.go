// Package postgres keeps idemhttp's shared state in PostgreSQL: [Store], an
// [idemserver.Store] that every instance of a service shares, and
// [Journal], an [idemhttp.Journal] that a fleet of batch workers shares,
// handing out pending operations with leases so that a dead worker's
// operations are resumed by another with the same keys.
//
// It lives in its own module so that idemhttp's core does not depend on
// pgx. Give it a [*pgxpool.Pool] and create the tables once with [Migrate]
// (or apply [Schema] with a migration tool):
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db-primary/app")
//	...
//	if err := postgres.Migrate(ctx, pool); err != nil { ... }
//	mw := &idemserver.Middleware{Store: postgres.NewStore(pool), Principal: accountOf}
//
// The tables (idemhttp_keys and idemhttp_journal) go into the first schema
// on the connection's search_path: to keep two applications apart in one
// database, give each a schema and set search_path in its connection
// string (?search_path=billing).
//
// # The primary only
//
// Claims and the reads that follow them must go to the primary, never to a
// read replica, and the pool given to [NewStore] and [NewJournal] must be
// connected to it. Replication is asynchronous: a replica that lags by a few
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
// Retry-After; a response whose Complete fails is still sent to its caller
// but not stored, and its key is free again after the lock timeout.
//
// # The journal and the worker loop
//
// A batch is loaded into the journal as pending entries, by a producer with
// [Journal.Enqueue] or by the workers' own [idemhttp.Client.Do] calls
// (which [Journal.Begin] leases to the calling worker). Each worker then
// loops: [Journal.ClaimPending] leases it the oldest entries no live lease
// holds (SELECT ... FOR UPDATE SKIP LOCKED, so workers never wait for each
// other), and it sends each one through an [idemhttp.Client] whose Journal
// is the same Journal, with the entry's own key, operation id and body;
// the client records the outcome, which ends the lease:
//
//	j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "worker-7"})
//	client := &idemhttp.Client{Journal: j, PrepareRequest: addCredentials}
//	for {
//		entries, err := j.ClaimPending(ctx, 16)
//		if err != nil { return err }
//		if len(entries) == 0 { /* none free: stop when Pending is empty, else wait */ }
//		for _, e := range entries {
//			rctx := idemhttp.WithOperation(idemhttp.WithKey(ctx, e.Key), e.Operation) // if e.Operation != ""
//			req, _ := http.NewRequestWithContext(rctx, e.Method, e.URL, bytes.NewReader(e.Body))
//			for name, vals := range e.Header { req.Header[name] = vals }
//			resp, err := client.Do(req)
//			if errors.Is(err, idemhttp.ErrKeyExpired) {
//				// The server has forgotten the key: do not resend.
//				j.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateAbandoned})
//			}
//			...
//		}
//	}
//
// A worker that dies (or hangs) keeps its entries until their leases
// expire; then another worker claims them and resends them with the same
// keys, and the server either replays the stored response or runs the
// operation for the first time. The lease only saves work: correctness
// rests on the keys, so a worker that outlives its lease and sends at the
// same time as its successor is safe (one of them gets a 409 or a replay).
// Do not call [idemhttp.Client.Resume] in a fleet: it resends every
// pending entry, including those other workers hold.
//
// Credentials never reach the table: Authorization, Cookie,
// Proxy-Authorization and [JournalOptions.SecretHeaders] are stripped
// whatever the caller passes, and URL passwords removed. Add credentials in
// [idemhttp.Client.PrepareRequest].
//
// # Durability
//
// A method returns after its transaction commits; with PostgreSQL's
// default synchronous_commit = on, that is after the WAL reached the
// primary's disk. Lowering synchronous_commit for these tables trades
// that for speed: a crash of the database can then forget claims and
// responses already answered, and their retries run the effect again.
package postgres
