// Package servercore is the server core: every decision of a request that
// carries an idempotency key, in one place, whichever middleware serves it
// (idemserver.Middleware over a Store, contrib/postgres's TxMiddleware,
// internal/servermodel's TxServer). Those are its shells: they do the I/O
// and carry out what the core returns; none keeps a rule of its own.
//
// The core has no driver, no goroutine and no clock, in the manner of
// etcd's raft: evidence in, decisions out. A shell makes a [Config] per
// middleware and a [Request] per keyed request ([Config.Start]), then
// calls, in order:
//
//   - [Request.Claimed] with what its claim found ([Found]: a store's
//     ClaimResult, or [TxFound] of a transactional claim): run the handler,
//     or answer without running it ([Verdict]);
//   - [Request.Returned] with the evidence of the handler's end
//     ([Handler]): keep its response, keep its key as not replayable, or
//     give the claim up ([Plan]);
//   - then, until it says Done, the report of each store call: Streamed,
//     [Request.Completed], [Request.Pinned], [Request.ReleaseDone];
//     Transactional, [Request.Committed], [Request.RolledBack],
//     [Request.Rechecked], [Request.Marked] ([Step]). The time a call began
//     and ended is evidence the shell passes (its clock, or the
//     simulator's).
//
// A request moves through the phases of [Phase] along the table of
// phase.go, which refuses (and counts: [Refused]) every other move; the
// moves, their evidence, and the moves that must never happen are in
// docs/server.md. The record a store keeps for a key is written and read
// here too ([EncodeHead], [Unreplayable], [ParseRecord]), with its
// version in its first byte.
//
// For the simulator: drive a Request with any evidence, in any order the
// shells could produce; [Config.Observe] reports every move, and a refused
// move is a bug of the core.
package servercore
