package postgres

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/contract"
)

// copyHooks copies the caller's hooks, as idemserver.Middleware does, so
// that changing them later has no effect on a middleware already made.
func copyHooks(h *idemserver.Hooks) *idemserver.Hooks {
	if h == nil {
		return nil
	}
	c := *h
	return &c
}

// txReport tells a request's hooks what became of it. Its zero value (no
// hooks, or a request without a key) reports nothing and reads no clock.
type txReport struct {
	hk       *idemserver.Hooks
	ctx      context.Context
	ev       idemserver.RequestEvent
	start    time.Time // when the claim began
	answered time.Time // when the claim was answered
	done     bool      // the request's end was reported
}

// reporter returns the report of a request: c is nil for one without a key.
func (h *txHandler) reporter(r *http.Request, c *txClaim) txReport {
	hk := h.m.hooks
	if hk == nil || c == nil {
		return txReport{done: true}
	}
	ev := idemserver.RequestEvent{Method: r.Method, Path: r.URL.Path}
	if hk.RecordScope {
		ev.Scope = c.Scope
	}
	if hk.RecordKey {
		ev.Key = c.Key
	}
	return txReport{hk: hk, ctx: r.Context(), ev: ev, start: time.Now()}
}

func (rp *txReport) claimed() {
	if rp.hk != nil {
		rp.answered = time.Now()
	}
}

func (rp *txReport) claim(o idemserver.ClaimOutcome, status int) {
	if rp.hk == nil {
		return
	}
	if o != idemserver.ClaimNew {
		rp.done = true
	}
	if rp.hk.OnClaim != nil {
		rp.hk.OnClaim(rp.ctx, idemserver.ClaimEvent{RequestEvent: rp.ev, Outcome: o, Status: status, Latency: rp.answered.Sub(rp.start)})
	}
}

func (rp *txReport) stored(status int, replayable bool) {
	if rp.hk == nil {
		return
	}
	rp.done = true
	if rp.hk.OnStored != nil {
		rp.hk.OnStored(rp.ctx, idemserver.StoredEvent{RequestEvent: rp.ev, Status: status, Replayable: replayable, Latency: time.Since(rp.answered)})
	}
}

func (rp *txReport) released(reason idemserver.ReleaseReason, status int) {
	if rp.hk == nil {
		return
	}
	rp.done = true
	if rp.hk.OnReleased != nil {
		rp.hk.OnReleased(rp.ctx, idemserver.ReleasedEvent{RequestEvent: rp.ev, Reason: reason, Status: status, Latency: time.Since(rp.answered)})
	}
}

func (rp *txReport) refused(reason idemserver.RefusalReason, status int, err error) {
	if rp.hk == nil {
		return
	}
	rp.done = true
	if rp.hk.OnRefused != nil {
		rp.hk.OnRefused(rp.ctx, idemserver.RefusedEvent{RequestEvent: rp.ev, Reason: reason, Status: status, Err: err})
	}
}

func (rp *txReport) storeError(op idemserver.StoreOp, status int, err error) {
	if rp.hk == nil {
		return
	}
	rp.done = true
	if rp.hk.OnStoreError != nil {
		rp.hk.OnStoreError(rp.ctx, idemserver.StoreErrorEvent{RequestEvent: rp.ev, Op: op, Status: status, Err: err})
	}
}

// logKey returns the attribute a log record names key by: its digest, and
// the key too with Hooks.RecordKey.
func (m *TxMiddleware) logKey(key string) slog.Attr { return contract.LogKey(key, m.logKeys) }
