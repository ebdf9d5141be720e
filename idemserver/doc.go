// Package idemserver is the server half of idemhttp: [net/http] middleware
// that makes any handler honour the Idempotency-Key contract, so clients
// may retry POST and PATCH requests without the work running twice.
//
// Wrap a handler with a [Middleware]. Say whose keys a request carries
// (Principal), or that one party sends every request (SingleTenant);
// there is no default, since one shared key space in a multi-tenant API
// lets one caller replay another's responses:
//
//	mw := &idemserver.Middleware{
//		Principal: func(r *http.Request) string { return accountOf(r) },
//		Required:  true,
//	}
//	// Wrap panics (ErrMisconfigured) without Principal or SingleTenant.
//	http.Handle("POST /v1/charges", mw.Wrap(chargeHandler))
//
// The first request with a key runs the handler and its response is
// stored; a retry with the same key and request gets that response back,
// marked Idempotent-Replayed: true, without running the handler; a retry
// while the first still runs gets 409 with Retry-After; the same key with a
// different request gets 422. Keys are scoped by the Principal, so tenants
// cannot see each other's responses; a request the Principal cannot name
// (it returns "") is refused. Requests are compared by meaning
// ([DefaultFingerprint]): a retry whose JSON members, form fields or query
// parameters come in another order is the same request, while two
// requests a Go handler decodes differently (JSON names that differ only
// in letter case, in another order) are not. The Host is not part of the
// request: a retry may reach another instance under another name.
//
// The middleware fails closed: whenever it cannot tell whether the
// handler's effect happened, it refuses rather than run it again. A claim
// is renewed while its handler runs, however long, and survives store
// outages shorter than most of its lock timeout; a response too large to
// store, or a hijacked connection, keeps its key completed (410 for
// retries); a full or failing store answers 503 and runs nothing; a store
// that hangs holds a finished response no longer than the claim's lock; a
// handler that gives up on a cancelled request without answering releases
// its key. Replays carry only the header fields the handler set, never
// Set-Cookie unless allowed, whatever the spelling of the names. See
// [Middleware] for each rule.
//
// Claims and responses live in a [Store]. [MemoryStore] serves a single
// process, bounded in records and bytes, and each principal's share of
// them, so that one caller cannot fill it for all; stores shared by several
// processes (Redis, PostgreSQL) live in their own modules, and every store
// must pass the conformance suite in package storetest.
//
// [Hooks] report each decision (claims and their outcomes, stored
// responses, released keys, renewal failures, store errors, refusals) for
// metrics and traces; idemhttp's contrib/otel module builds on them.
// Neither they nor the Logger's records carry the idempotency key unless
// Hooks.RecordKey says so: a log record names a key by its [KeyDigest].
//
// Every decision is taken by the server core that contrib/postgres's
// TxMiddleware shares, so the two answer alike: docs/server.md, at the
// repository's root, draws a keyed request's phases and the evidence of
// each move.
//
// # Shutdown, hung handlers, upgrades
//
// A server that stops leaves its claims in the store, where they expire
// with their lock timeout (retries get 409 until then), and its responses
// for their TTL; http.Server.Shutdown lets running handlers finish and
// their responses be stored. A handler that hangs keeps its claim for as
// long as it runs (the renewals). A store that does not answer holds no
// request past its client's context or the lock timeout: 503.
//
// Records are a versioned format (their first byte), and so are
// fingerprints: records stored by earlier releases keep replaying after an
// upgrade, their fingerprints accepted by the default one. During a
// rolling deploy from the release before this one, set Fingerprint to
// [PreviousFingerprint] so that instances of both releases agree on every
// key; docs/server.md, "Formats and upgrades", says why and when to remove
// it.
package idemserver
