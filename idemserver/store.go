package idemserver

import (
	"context"
	"time"

	"github.com/idemkit/idemhttp/internal/servercore"
)

// ErrClaimLost is returned by [Store.Complete] and [Store.Release] when the
// token no longer holds an in-progress claim on the key: the claim's lock
// timed out (and perhaps a newer request claimed the key), or the claim was
// already completed or released. A stale request can therefore never
// overwrite or free a newer request's claim.
var ErrClaimLost = servercore.ErrClaimLost

// ErrStoreFull is returned by [Store.Claim] when the store is at its bound
// and refuses to record a new claim rather than evict a live record (which
// would let its key run a second time). The middleware answers 503
// ([TypeStoreFull]) with Retry-After; nothing ran. [MemoryStore] returns it
// when it holds MaxEntries records or MaxBytes bytes; a shared store may
// return it (wrapped) when its server refuses writes for lack of memory.
var ErrStoreFull = servercore.ErrStoreFull

// ClaimState says what [Store.Claim] found under a key.
type ClaimState int

// The outcomes of [Store.Claim].
const (
	// Claimed: no live record held the key (none, an expired one, or an
	// in-progress one whose lock timed out), so the store recorded a new
	// in-progress claim owned by the caller's token. The caller runs the
	// request, then calls Complete or Release with that token.
	Claimed ClaimState = iota + 1
	// InProgress: another claim holds the key and its lock has not timed out.
	InProgress
	// Completed: a response is stored under the key.
	Completed
)

// String returns the state's name.
func (s ClaimState) String() string {
	switch s {
	case Claimed:
		return "claimed"
	case InProgress:
		return "in progress"
	case Completed:
		return "completed"
	}
	return "unknown"
}

// Claim describes the caller's claim on a key, for [Store.Claim].
type Claim struct {
	// Token identifies this claim. It must be unique per request; the
	// store compares it in Complete and Release.
	Token string
	// Fingerprint identifies the request (method, path, query, body hash).
	// The store keeps it with the record and returns it to later claimers,
	// which compare it with their own.
	Fingerprint string
	// LockTimeout is how long the claim holds the key without Complete or
	// Release; it must be positive. After that the claim counts as
	// abandoned (a crashed server) and the next Claim takes the key over.
	LockTimeout time.Duration
	// Scope is the principal's scope the key belongs to (the
	// [Middleware]'s Principal; empty with SingleTenant). The key already
	// includes it: a store may ignore it, or bound each scope's share of
	// its room, as [MemoryStore] does, so that one principal cannot fill
	// the store for everyone.
	Scope string
}

// ClaimResult is what [Store.Claim] found.
type ClaimResult struct {
	// State is Claimed, InProgress or Completed.
	State ClaimState
	// Fingerprint is the fingerprint of the request that first claimed the
	// key; empty when State is Claimed.
	Fingerprint string
	// Record is the stored response when State is Completed, as it was
	// given to Complete; nil otherwise. It may share memory with the
	// store: the caller must not modify it.
	Record []byte
}

// Store keeps idempotency records: one per key, either an in-progress claim
// or a completed response. It is shared by every server instance that
// handles the same keys, and must be safe for concurrent use. [MemoryStore]
// is the in-process implementation; package storetest holds the
// conformance suite every implementation must pass.
//
// A completed response is an opaque, non-empty byte string to the store
// (the record format of [Response.MarshalBinary], which the middleware
// writes and reads), so a store is a key-value store with claim semantics
// and never parses HTTP.
//
// Keys are opaque strings of any bytes (the middleware combines the
// principal's scope with the idempotency key); a store that cannot hold some
// bytes must encode keys, for instance in hex. Durations are relative, so a
// store may measure them with its own clock: Redis with PX, PostgreSQL with
// now(). A sketch of both:
//
//   - Redis: Claim is SET key claim NX PX lockTimeout, then GET if the key
//     exists (or one Lua script doing both); Complete, Renew and Release
//     are Lua scripts that compare the stored token before SET ... PX ttl,
//     PEXPIRE or DEL.
//   - PostgreSQL: Claim is INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE
//     the existing row has expired (its lock or its TTL) RETURNING, then a
//     SELECT when nothing was returned; Complete and Renew are UPDATE ...
//     WHERE key and token match and the lock is live; Release is DELETE ...
//     WHERE the same.
//
// Read from the primary only: a replica that lags lets two requests claim
// the same key.
//
// Every method must return once its ctx is done: the middleware bounds
// each call with a deadline, and a call that ignored it could hold a
// request for ever.
type Store interface {
	// Claim atomically looks up key. If no live record holds it, Claim
	// records an in-progress claim from c, locked for c.LockTimeout, and
	// returns State Claimed. Otherwise it changes nothing and returns
	// InProgress or Completed with the existing record's fingerprint. An
	// error means nothing is known: the caller must not run the request.
	// A store that refuses new claims because it is full returns an error
	// that wraps [ErrStoreFull].
	Claim(ctx context.Context, key string, c Claim) (ClaimResult, error)

	// Renew extends the in-progress claim on key held by token, so that it
	// holds the key for lockTimeout (positive) from now, as Claim did. The
	// middleware calls it every tenth of the lock timeout while the handler
	// runs, and again promptly after a failure, so a handler slower than the
	// lock timeout keeps its claim. It
	// returns ErrClaimLost if token no longer holds a live claim on key: a
	// claim whose lock already timed out is not revived, since another
	// request may have taken the key over.
	Renew(ctx context.Context, key, token string, lockTimeout time.Duration) error

	// Complete stores record under key, replacing the in-progress claim
	// held by token, and keeps it for ttl (positive) from now. It returns
	// ErrClaimLost if token no longer holds a live claim on key. The store
	// may keep record itself: the caller must not modify it afterwards.
	Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error

	// Release deletes the in-progress claim on key held by token, so that
	// the next request with the key runs again. It returns ErrClaimLost if
	// token no longer holds a live claim on key; a completed record is
	// never released.
	Release(ctx context.Context, key, token string) error
}
