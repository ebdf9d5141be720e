package idemserver

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
	"github.com/idemkit/idemhttp/internal/servercore"
)

// The Streamed shell: idemserver's requests through the server core
// (internal/servercore), which takes every decision. What is here maps the
// core's decisions onto the Store's calls, the response and the hooks.

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(h.methods, r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	values := r.Header[h.header]
	switch {
	case len(values) == 0 && h.required:
		h.writeError(w, r, problemKeyMissing(h.header))
		return
	case len(values) == 0:
		h.next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		h.writeError(w, r, problemKeyInvalid(h.header, "The request carries more than one "+h.header+" header."))
		return
	}
	key, err := parseKey(values[0], h.form)
	if err != nil {
		h.writeError(w, r, problemKeyInvalid(h.header, keyProblemDetail(err)))
		return
	}
	body, err := readBody(r, h.maxBody)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			h.writeError(w, r, problemBodyTooLarge(h.maxBody))
		} else {
			h.writeError(w, r, problemBodyUnreadable())
		}
		return
	}
	r.Body = newBodyReader(body)

	scope := ""
	if h.principal != nil {
		if scope = h.principal(r); scope == "" {
			// One key space for every caller the Principal cannot name
			// would let one of them replay another's response.
			h.logger.ErrorContext(r.Context(), "idemserver: Principal returned an empty scope; answered 500 and ran nothing", "key", key)
			h.writeError(w, r, problemNoPrincipal())
			h.hooks.refused(r.Context(), r, "", key, RefusedNoPrincipal, http.StatusInternalServerError, errNoPrincipal)
			return
		}
	}
	fp := h.fingerprint(r, body)
	storeKey := scopedKey(scope, key)
	token := string(strconv.AppendUint([]byte(h.tokenPrefix), h.tokens.Add(1), 36))

	start := h.hooks.clock()
	claimed := h.renewer.clock.now() // the claim's lock runs from no earlier than this
	cctx, cancel := h.bounded(r.Context(), claimed.Add(h.lockTimeout))
	res, err := h.store.Claim(cctx, storeKey, Claim{Token: token, Fingerprint: fp, LockTimeout: h.lockTimeout, Scope: scope})
	cancel()
	claimLatency := since(start)
	q := h.core.Start()
	hdr := w.Header()
	v := q.Claimed(servercore.Claim{
		Err:         err,
		Found:       servercore.Found{State: servercore.State(res.State), Fingerprint: res.Fingerprint, Record: res.Record},
		Fingerprint: fp,
		Request:     r,
		Body:        body,
	}, hdr)
	ctx := r.Context()
	switch v.Answer {
	case servercore.AnswerRun:
		h.run(w, r, &q, scope, key, storeKey, token, claimed, start, claimLatency)
	case servercore.AnswerStoreFull:
		h.logger.WarnContext(ctx, "idemserver: store full; answered 503", "key", key, "error", v.Err)
		hdr.Set("Retry-After", h.retryAfter)
		h.writeError(w, r, problemStoreFull(key))
		h.hooks.refused(ctx, r, scope, key, RefusedStoreFull, http.StatusServiceUnavailable, v.Err)
	case servercore.AnswerStoreFailed:
		h.storeFailed(w, r, scope, key, StoreOpClaim, v.Err)
	case servercore.AnswerCorrupt:
		h.storeFailed(w, r, scope, key, StoreOpReplay, v.Err)
	case servercore.AnswerMismatch:
		h.writeError(w, r, problemKeyMismatch(h.header, key))
		h.hooks.claim(ctx, r, scope, key, ClaimMismatch, http.StatusUnprocessableEntity, claimLatency)
	case servercore.AnswerInProgress:
		hdr.Set("Retry-After", h.retryAfter)
		h.writeError(w, r, problemInProgress(h.header, key))
		h.hooks.claim(ctx, r, scope, key, ClaimInProgress, http.StatusConflict, claimLatency)
	case servercore.AnswerNotReplayable:
		h.writeError(w, r, problemNotReplayable(h.header, key, v.Status))
		h.hooks.claim(ctx, r, scope, key, ClaimNotReplayable, http.StatusGone, claimLatency)
	default: // AnswerReplay: the record's header is in hdr already
		hdr.Set(ReplayedHeader, "true")
		w.WriteHeader(v.Status)
		_, _ = w.Write(v.Body) // a failed write means the client left
		h.hooks.claim(ctx, r, scope, key, ClaimReplay, v.Status, claimLatency)
	}
}

// bounded returns ctx with a deadline at until, for a call to a store
// that may wait on the network: a request whose store does not answer
// (a partition) gets 503 within its own context or the lock timeout, and
// a request nobody waits for any more holds none of the store's
// connections. The memory store's methods never wait but for its
// mutexes, so its calls get no deadline: a context with one arms a
// runtime timer per request, which the renewer's design measured at 7%
// of a loopback round trip. until is a reading of the renewer's clock,
// the process's: the deadline is the time left until then on that clock,
// not until itself, which the runtime would measure on its own.
func (h *handler) bounded(ctx context.Context, until time.Time) (context.Context, context.CancelFunc) {
	if _, ok := h.store.(*MemoryStore); ok {
		return ctx, func() {}
	}
	if plant.ProcDeadline {
		return context.WithDeadline(ctx, until)
	}
	return context.WithTimeout(ctx, until.Sub(h.renewer.clock.now()))
}

// storeFailed answers 503 when the store cannot say what became of a key:
// without that, running the handler could run it twice.
func (h *handler) storeFailed(w http.ResponseWriter, r *http.Request, scope, key string, op StoreOp, err error) {
	h.logger.ErrorContext(r.Context(), "idemserver: store failed; answered 503", "key", key, "error", err)
	w.Header().Set("Retry-After", h.retryAfter)
	h.writeError(w, r, problemStoreUnavailable(key))
	h.hooks.storeError(r.Context(), r, scope, key, op, http.StatusServiceUnavailable, err)
}

// run serves a request whose key this process has just claimed (the
// Claim sent at claimed), then stores the response or releases the key,
// as the core decides. scope, key, start (the claim's time, zero
// without hooks) and claimLatency are for the hooks.
func (h *handler) run(w http.ResponseWriter, r *http.Request, q *servercore.Request, scope, key, storeKey, token string, claimed, start time.Time, claimLatency time.Duration) {
	// The request's context ends when the client leaves, but the work is
	// done by then and its outcome must still be recorded.
	ctx := context.WithoutCancel(r.Context())
	rec := &recorder{rw: w, limit: h.maxStored, keep: h}
	if hdr := w.Header(); len(hdr) > 0 {
		// Outer middleware set these before the handler ran; it will set
		// them again, afresh, around a replay.
		rec.outer = hdr.Clone()
	}
	if h.hooks != nil && h.hooks.OnRenewFailed != nil {
		// For OnRenewFailed, built here so that the renewal's goroutine
		// never reads the request. In the context rather than in the
		// renewal, so that a request without hooks does not pay for it.
		ctx = withRenewEvent(ctx, h.hooks.event(r, scope, key))
	}
	rec.renewal.start(ctx, h, storeKey, token, claimed)
	f := finisher{h: h, r: r, q: q, rec: rec, scope: scope, key: key, storeKey: storeKey, token: token, start: start}
	returned := false
	defer func() {
		switch {
		case !returned:
			// The handler panicked (or called runtime.Goexit), or the
			// OnClaim hook did before it ran: the core releases the key
			// so a retry can run, and the panic goes on unrecovered, with
			// its original stack, to net/http.
			f.finish(ctx, servercore.Handler{Panicked: true, Status: rec.status, Wrote: rec.wroteHeader, Hijacked: rec.hijacked})
		case !f.planned:
			// The server author's ShouldStore panicked after the handler
			// ran: without this the key stayed claimed, unrenewed, and
			// ran again once its lock timed out.
			f.finish(ctx, servercore.Handler{Unjudged: true, Status: f.status, Wrote: rec.wroteHeader, Hijacked: rec.hijacked})
		}
	}()
	h.hooks.claim(r.Context(), r, scope, key, ClaimNew, 0, claimLatency)
	h.next.ServeHTTP(rec, r)
	returned = true
	status := rec.status
	if !rec.wroteHeader && !rec.hijacked {
		status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	f.status = status
	f.finish(ctx, servercore.Handler{
		Wrote:      rec.wroteHeader,
		Status:     status,
		Hijacked:   rec.hijacked,
		Overflow:   rec.overflow,
		ClientGone: r.Context().Err() != nil,
	})
}

// finisher carries out the core's decision once a handler has returned.
type finisher struct {
	h               *handler
	r               *http.Request
	q               *servercore.Request
	rec             *recorder
	scope, key      string
	storeKey, token string
	start           time.Time
	status          int  // the handler's final status, once it returned
	planned         bool // the core has planned the run's end (Returned)
}

// finish stops the renewals and keeps the response or releases the key,
// as the core's plan says, retrying the store while the claim's lock is
// live, then tells the hooks. A store that hangs holds the finished
// response (whose last bytes net/http sends when the handler returns) no
// longer than that lock, and no sooner than a tenth of the lock timeout
// from now.
func (f *finisher) finish(ctx context.Context, ev servercore.Handler) {
	h := f.h
	expires := f.rec.renewal.stop()
	clock := h.renewer.clock
	if floor := clock.now().Add(h.lockTimeout / 10); expires.Before(floor) {
		expires = floor
	}
	ev.LockUntil, ev.Retry = expires, h.renewer.retry
	plan := f.q.Returned(ev)
	f.planned = true
	var record []byte
	op := StoreOpRelease
	switch plan.Do {
	case servercore.Keep:
		f.rec.finish()
		record = f.rec.takeRecord()
		op = StoreOpComplete
	case servercore.KeepUnreplayable:
		record = servercore.Unreplayable(plan.Status)
		op = StoreOpComplete
	}
	var err error
	for {
		began := clock.now()
		actx, cancel := h.bounded(ctx, earliest(expires, began.Add(h.renewer.attempt)))
		var step servercore.Step
		if record != nil {
			err = h.store.Complete(actx, f.storeKey, f.token, record, h.ttl)
			step = f.q.Completed(err, began, clock.now())
		} else {
			err = h.store.Release(actx, f.storeKey, f.token)
			step = f.q.ReleaseDone(err, began, clock.now())
		}
		cancel()
		if step.Do == servercore.Pin {
			// Keep the claim for the TTL, so that should no Complete get
			// through, the key answers 409 rather than run again.
			began := clock.now()
			pctx, cancel := h.bounded(ctx, earliest(expires, began.Add(h.renewer.attempt)))
			perr := h.store.Renew(pctx, f.storeKey, f.token, h.ttl)
			cancel()
			step = f.q.Pinned(perr, began, clock.now())
		}
		if step.Do == servercore.Done {
			f.report(ctx, step, plan, op, err)
			return
		}
		h.logger.ErrorContext(ctx, "idemserver: the store failed after the handler; trying again", "op", string(op), "error", err)
		sleep(clock, step.At.Sub(clock.now()))
	}
}

// report tells the log and the hooks how a run ended.
func (f *finisher) report(ctx context.Context, step servercore.Step, plan servercore.Plan, op StoreOp, err error) {
	h, r := f.h, f.r
	status := plan.Status
	switch step.Phase {
	case servercore.Stored:
		h.hooks.stored(ctx, r, f.scope, f.key, status, plan.Do == servercore.Keep, f.start)
	case servercore.Released:
		h.hooks.released(ctx, r, f.scope, f.key, ReleaseReason(plan.Reason), status, f.start)
	case servercore.Pinned:
		h.logger.ErrorContext(ctx, "idemserver: response not stored; its key stays claimed for the TTL, so that a retry gets 409 rather than run again", "status", status, "error", err)
		h.hooks.storeError(ctx, r, f.scope, f.key, op, status, err)
	default: // Unsettled, Lost
		if op == StoreOpComplete {
			h.logger.ErrorContext(ctx, "idemserver: response not stored", "status", status, "error", err)
		} else {
			h.logger.ErrorContext(ctx, "idemserver: release failed; the key stays claimed until its lock times out", "status", status, "error", err)
		}
		h.hooks.storeError(ctx, r, f.scope, f.key, op, status, err)
	}
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// sleep waits d on c.
func sleep(c clock, d time.Duration) {
	if d <= 0 {
		return
	}
	done := make(chan struct{})
	t := c.afterFunc(d, func() { close(done) })
	<-done
	t.Stop()
}
