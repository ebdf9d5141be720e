// Package idemserver is the server half of idemhttp: [net/http] middleware
// that makes any handler honour the Idempotency-Key contract, so clients
// may retry POST and PATCH requests without the work running twice.
//
// Wrap a handler with a [Middleware]; its zero value works:
//
//	mw := &idemserver.Middleware{
//		Principal: func(r *http.Request) string { return accountOf(r) },
//		Required:  true,
//	}
//	http.Handle("POST /v1/charges", mw.Wrap(chargeHandler))
//
// The first request with a key runs the handler and its response is
// stored; a retry with the same key and request gets that response back,
// marked Idempotent-Replayed: true, without running the handler; a retry
// while the first still runs gets 409 with Retry-After; the same key with a
// different request gets 422. Keys are scoped by the Principal, so tenants
// cannot see each other's responses.
//
// Claims and responses live in a [Store]. [MemoryStore] serves a single
// process; stores shared by several processes (Redis, PostgreSQL) live in
// their own modules, and every store must pass the conformance suite in
// package storetest.
package idemserver
