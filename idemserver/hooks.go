package idemserver

import (
	"context"
	"net/http"
	"time"
)

// Hooks are functions a [Middleware] calls at each of its decisions, for
// metrics, traces and audit logs (idemhttp's contrib/otel builds on them).
// Every function may be nil; a Middleware whose Hooks is nil pays nothing
// for them: no event is built and no clock is read.
//
// A keyed request that reaches the store gets exactly one of OnClaim,
// OnRefused or OnStoreError (with [StoreOpClaim] or [StoreOpReplay]) for
// its claim; a request that claimed a new key then gets exactly one of
// OnStored or OnReleased, or OnStoreError when the store failed to record
// which, when its handler has finished. OnRenewFailed may come between.
//
// Hooks run synchronously on the request's goroutine (OnRenewFailed on the
// renewal's), so they must not block. The ctx each gets carries the
// request context's values, so a tracer finds the request's span in it;
// after the handler ran it is no longer cancelled with the request, and it
// is not for blocking on.
//
// Events carry the request's method and URL path (never the query, which
// may carry secrets); the principal's scope and the idempotency key only
// when RecordScope and RecordKey allow: a scope may name a tenant, and a
// key names one operation whose stored response it can fetch.
type Hooks struct {
	// RecordScope puts the principal's scope in [RequestEvent.Scope].
	RecordScope bool
	// RecordKey puts the idempotency key in [RequestEvent.Key], and in
	// the middleware's log records (key, beside key_digest), which
	// otherwise name it only by its [KeyDigest].
	RecordKey bool

	// OnClaim is called once the store has answered a claim, with its
	// outcome; for a replay, after the stored response was sent.
	OnClaim func(ctx context.Context, ev ClaimEvent)

	// OnStored is called when a handler's response has been stored for
	// replays, or its key marked as completed but not replayable (a
	// response too large to keep, a hijacked connection, a 101).
	OnStored func(ctx context.Context, ev StoredEvent)

	// OnReleased is called when a claimed key has been released, so that
	// a retry runs the handler again.
	OnReleased func(ctx context.Context, ev ReleasedEvent)

	// OnRenewFailed is called when renewing a running handler's claim
	// failed; with Lost, the claim is gone and a retry may run the
	// handler again.
	OnRenewFailed func(ctx context.Context, ev RenewFailedEvent)

	// OnStoreError is called when the store failed: a claim or a stored
	// record (answered 503), or the Complete or Release after a handler.
	OnStoreError func(ctx context.Context, ev StoreErrorEvent)

	// OnRefused is called when the middleware refused a request without
	// asking the store or running the handler's effect: a full store
	// (503) or a request the Principal could not name (500).
	OnRefused func(ctx context.Context, ev RefusedEvent)
}

// RequestEvent identifies a request; every event embeds it.
type RequestEvent struct {
	Method string // request method
	Path   string // the URL path, without the query
	Scope  string // the principal's scope, only with Hooks.RecordScope
	Key    string // the idempotency key, only with Hooks.RecordKey
}

// ClaimOutcome is what a claim found, in a [ClaimEvent].
type ClaimOutcome string

// The outcomes of [ClaimEvent.Outcome].
const (
	ClaimNew           ClaimOutcome = "new"            // the key was free: the handler runs
	ClaimInProgress    ClaimOutcome = "in_progress"    // another request with the key is running: 409
	ClaimReplay        ClaimOutcome = "replay"         // completed: the stored response was replayed
	ClaimMismatch      ClaimOutcome = "mismatch"       // the key was used with another request: 422
	ClaimNotReplayable ClaimOutcome = "not_replayable" // completed, but its response was too large to keep: 410
)

// ClaimEvent describes a claim's outcome. See [Hooks.OnClaim].
type ClaimEvent struct {
	RequestEvent
	Outcome ClaimOutcome
	// Status is the status answered: 409, 422 or 410, the replayed
	// status, or 0 for ClaimNew (the handler answers).
	Status  int
	Latency time.Duration // how long the store took to answer the claim
}

// StoredEvent describes a stored response. See [Hooks.OnStored].
type StoredEvent struct {
	RequestEvent
	Status     int           // the handler's status
	Replayable bool          // false: too large to keep, or hijacked; retries get 410
	Latency    time.Duration // from the claim to the response stored
}

// ReleaseReason says why a claimed key was released, in a [ReleasedEvent].
type ReleaseReason string

// The reasons of [ReleasedEvent.Reason].
const (
	ReleaseServerError ReleaseReason = "server_error" // a 5xx that ShouldStore refused
	ReleaseNotStored   ReleaseReason = "not_stored"   // another status ShouldStore refused (such as 409 or 429)
	ReleaseNotStorable ReleaseReason = "not_storable" // an invalid status: nothing a replay could send
	ReleaseCanceled    ReleaseReason = "canceled"     // the request was cancelled and the handler answered nothing
	ReleasePanic       ReleaseReason = "panic"        // the handler panicked
	// The reasons of a transactional middleware (contrib/postgres's
	// TxMiddleware), whose release is a rollback of the handler's writes:
	ReleaseRolledBack ReleaseReason = "rolled_back" // the handler returned an error, or the commit was refused
	ReleaseClaimLost  ReleaseReason = "claim_lost"  // another claimer took the key meanwhile: the writes did not commit
)

// ReleasedEvent describes a released key. See [Hooks.OnReleased].
type ReleasedEvent struct {
	RequestEvent
	Reason  ReleaseReason
	Status  int           // the handler's status, 0 if it wrote none (always for canceled)
	Latency time.Duration // from the claim to the key released
}

// RenewFailedEvent describes a failed claim renewal. See
// [Hooks.OnRenewFailed].
type RenewFailedEvent struct {
	RequestEvent
	Lost bool  // the claim is gone ([ErrClaimLost]); otherwise it is retried
	Err  error // the store's error
}

// StoreOp names the store operation of a [StoreErrorEvent].
type StoreOp string

// The operations of [StoreErrorEvent.Op].
const (
	StoreOpClaim    StoreOp = "claim"    // Claim failed or returned an invalid state: 503
	StoreOpReplay   StoreOp = "replay"   // the stored record is corrupt: 503
	StoreOpComplete StoreOp = "complete" // the response was sent but not stored
	StoreOpRelease  StoreOp = "release"  // the key stays claimed until LockTimeout
)

// StoreErrorEvent describes a store failure. See [Hooks.OnStoreError].
type StoreErrorEvent struct {
	RequestEvent
	Op StoreOp
	// Status is the status answered: 503 for StoreOpClaim and
	// StoreOpReplay, the handler's for the others (0 if none).
	Status int
	Err    error
}

// RefusalReason says why a request was refused, in a [RefusedEvent].
type RefusalReason string

// The reasons of [RefusedEvent.Reason].
const (
	RefusedStoreFull   RefusalReason = "store_full"   // [ErrStoreFull]: 503
	RefusedNoPrincipal RefusalReason = "no_principal" // the Principal returned an empty scope: 500 ([TypeNoPrincipal])
)

// RefusedEvent describes a refused request. See [Hooks.OnRefused].
type RefusedEvent struct {
	RequestEvent
	Reason RefusalReason
	Status int   // the status answered
	Err    error // the store's error, or why the request has no scope
}

// event returns the identity of request r with key in scope, as hk allows.
func (hk *Hooks) event(r *http.Request, scope, key string) RequestEvent {
	ev := RequestEvent{Method: r.Method, Path: r.URL.Path}
	if hk.RecordScope {
		ev.Scope = scope
	}
	if hk.RecordKey {
		ev.Key = key
	}
	return ev
}

// clock returns the time now when a hook will want a latency, and the
// zero time (no clock read) otherwise.
func (hk *Hooks) clock() time.Time {
	if hk == nil {
		return time.Time{}
	}
	return time.Now()
}

// since returns the time from start, zero for a zero start.
func since(start time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return time.Since(start)
}

// The report functions below each do nothing on a nil *Hooks or an unset
// function, so that the middleware calls them unconditionally.

func (hk *Hooks) claim(ctx context.Context, r *http.Request, scope, key string, out ClaimOutcome, status int, latency time.Duration) {
	if hk == nil || hk.OnClaim == nil {
		return
	}
	hk.OnClaim(ctx, ClaimEvent{RequestEvent: hk.event(r, scope, key), Outcome: out, Status: status, Latency: latency})
}

// renewEventKey is the context key of the request identity the renewal
// of a claim reports to OnRenewFailed.
type renewEventKey struct{}

func withRenewEvent(ctx context.Context, ev RequestEvent) context.Context {
	return context.WithValue(ctx, renewEventKey{}, &ev)
}

func (hk *Hooks) renewFailed(ctx context.Context, lost bool, err error) {
	if hk == nil || hk.OnRenewFailed == nil {
		return
	}
	ev, ok := ctx.Value(renewEventKey{}).(*RequestEvent)
	if !ok {
		return
	}
	hk.OnRenewFailed(ctx, RenewFailedEvent{RequestEvent: *ev, Lost: lost, Err: err})
}

func (hk *Hooks) stored(ctx context.Context, r *http.Request, scope, key string, status int, replayable bool, start time.Time) {
	if hk == nil || hk.OnStored == nil {
		return
	}
	hk.OnStored(ctx, StoredEvent{RequestEvent: hk.event(r, scope, key), Status: status, Replayable: replayable, Latency: since(start)})
}

func (hk *Hooks) released(ctx context.Context, r *http.Request, scope, key string, reason ReleaseReason, status int, start time.Time) {
	if hk == nil || hk.OnReleased == nil {
		return
	}
	hk.OnReleased(ctx, ReleasedEvent{RequestEvent: hk.event(r, scope, key), Reason: reason, Status: status, Latency: since(start)})
}

func (hk *Hooks) storeError(ctx context.Context, r *http.Request, scope, key string, op StoreOp, status int, err error) {
	if hk == nil || hk.OnStoreError == nil {
		return
	}
	hk.OnStoreError(ctx, StoreErrorEvent{RequestEvent: hk.event(r, scope, key), Op: op, Status: status, Err: err})
}

func (hk *Hooks) refused(ctx context.Context, r *http.Request, scope, key string, reason RefusalReason, status int, err error) {
	if hk == nil || hk.OnRefused == nil {
		return
	}
	hk.OnRefused(ctx, RefusedEvent{RequestEvent: hk.event(r, scope, key), Reason: reason, Status: status, Err: err})
}
