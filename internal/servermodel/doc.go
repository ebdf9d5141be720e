// Package servermodel models what the server core (internal/servercore)
// runs against, in plain Go, so that the core's decisions can be driven
// through every fault in a test or in the simulator (internal/sim), in
// virtual time:
//
//   - [Store], an idemserver.Store: claims and records with lock
//     timeouts and TTLs on an injected clock, as the memory, Redis and
//     PostgreSQL stores keep them. Any call may be refused, hang until
//     its context ends, or do its work and lose its answer (the
//     ambiguous failure a network makes), as [Faults] decides per call.
//     idemserver.Middleware runs on it unchanged: the shell is the real
//     one, the store the model.
//   - [DB], a transactional database as contrib/postgres's TxMiddleware
//     uses it: a key table, transaction-level advisory locks, and a
//     ledger of the business's effects, all of which commit together or
//     not at all; every statement the middleware sends may be refused,
//     hang, or lose the connection, as [Faults] decides.
//   - [TxServer], the transactional shell over a DB: the same core as
//     TxMiddleware, with the same steps (claim row and lock in one
//     statement, the handler in the transaction, the record with COMMIT,
//     the marker of a handler that ended its transaction), mapped onto
//     the model instead of pgx. Its handlers get a [HandlerTx], with
//     which they may write effects, commit (COMMIT), commit and chain,
//     roll back, or leave the transaction aborted, and they may give up
//     when their client leaves.
//
// What the simulator needs: a Store or a DB per world (they outlive
// every server process, as a database does), a TxServer (or an
// idemserver.Middleware on the Store) per server process, the clock of
// the world as Now, and a Faults function drawing from the seed. The
// invariants to check are on the DB's ledger ([DB.Effects]): at most
// one committed effect per key, and a replayed response only for an
// effect that committed.
//
// The conformance suite of internal/servertest runs the same scripted
// scenarios against these models and against every real shell
// (idemserver.Middleware on the memory, PostgreSQL and Redis stores,
// TxMiddleware on PostgreSQL), and expects the same answers: what the
// models do is what the real ones do.
//
// Nothing here starts a goroutine or reads a clock but Now; a call that
// hangs waits for its context, which the shell bounds.
package servermodel
