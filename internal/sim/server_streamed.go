//go:build go1.26

package sim

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/serverclock"
	"github.com/idemkit/idemhttp/internal/servermodel"
)

// The streamed world (shellStreamed): each server process is an
// idemserver.Middleware, the server core in its Streamed mode, over the
// one modelled Store (servermodel.Store, which the store conformance
// suite holds to the contract of the memory, Redis and PostgreSQL
// stores). The business charges in its own database as the handler runs,
// and the record is the store's, apart: a crash between the two is the
// non-atomic mode's known limit, which the world does not throw at it
// (crashable); everything else is: a store that refuses a call, runs out
// of memory or loses its answer, a partition, its clock jumping, a
// second instance, several tenants, handlers that fail, give up or
// panic.

// streamedShell returns server process p's shell.
func (w *world) streamedShell(p *serverProc) http.Handler {
	mw := &idemserver.Middleware{
		Store:         storeView{s: w.kv, p: p},
		Required:      true,
		LockTimeout:   lockTimeout,
		RetryAfter:    time.Second,
		MaxStoredBody: maxStored,
		Logger:        slog.New(slog.DiscardHandler),
	}
	serverclock.Set(mw, p.now) // the process's own clock, which jumps (server_clock.go)
	if w.cfg.Tenants >= 2 {
		mw.Principal = principal
	} else {
		mw.SingleTenant = true
	}
	return mw.Wrap(http.HandlerFunc(p.streamCharge)) // panics on a misconfigured world
}

// storeView is the store as server process p reaches it: a dead
// process's calls fail (its connections went with it), and so does a
// call whose context is done before it begins, as go-redis's and pgx's
// do (the model itself waits on a context only when it hangs).
type storeView struct {
	s *servermodel.Store
	p *serverProc
}

var _ idemserver.Store = storeView{}

func (v storeView) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	if v.p.dead.Load() {
		return idemserver.ClaimResult{}, errServerGone
	}
	if err := ctx.Err(); err != nil {
		return idemserver.ClaimResult{}, err // a network store's client sends nothing then
	}
	return v.s.Claim(ctx, key, c)
}

func (v storeView) Renew(ctx context.Context, key, token string, lockTimeout time.Duration) error {
	if v.p.dead.Load() {
		return errServerGone
	}
	if err := ctx.Err(); err != nil {
		return err // a network store's client sends nothing then
	}
	return v.s.Renew(ctx, key, token, lockTimeout)
}

func (v storeView) Complete(ctx context.Context, key, token string, data []byte, ttl time.Duration) error {
	if v.p.dead.Load() {
		return errServerGone
	}
	if err := ctx.Err(); err != nil {
		return err // a network store's client sends nothing then
	}
	return v.s.Complete(ctx, key, token, data, ttl)
}

func (v storeView) Release(ctx context.Context, key, token string) error {
	if v.p.dead.Load() {
		return errServerGone
	}
	if err := ctx.Err(); err != nil {
		return err // a network store's client sends nothing then
	}
	return v.s.Release(ctx, key, token)
}

// streamCharge is the business handler of the streamed world: it
// charges in the business's database at once, and answers; or, as the
// seed says, fails (500), gives up when its client leaves, or panics,
// each before it charges (a handler that charged and then answered 500
// would be charged again by the retry the 500 invites: the application's
// bug, not the middleware's).
func (p *serverProc) streamCharge(rw http.ResponseWriter, r *http.Request) {
	w := p.w
	op, ok := opOfRequest(r)
	key, storeKey, kok := w.requestKey(r)
	if !ok || !kok {
		http.Error(rw, "bad request", http.StatusBadRequest)
		return
	}
	name := run(r)
	if w.serverPoint(p, "handler.start", name) || w.pause(p, op, key, name) {
		return
	}
	b := w.behaviour(p, op, key, name)
	switch b {
	case behFail:
		http.Error(rw, "the business failed", http.StatusInternalServerError)
		return
	case behGiveUp:
		<-r.Context().Done()
		return
	case behPanic:
		panic(http.ErrAbortHandler)
	}
	if p.dead.Load() {
		return
	}
	if rs, ok := r.Context().Value(reqKey{}).(*reqState); ok {
		rs.charged = true
		p.open.Add(1)
	}
	e := &effect{op: op, key: key, storeKey: storeKey, server: p.n, at: time.Now()}
	w.ledger.newCharge(e)
	if b == behBig {
		big(e) // sent whole; the key kept, not replayable (410)
	}
	w.ledger.database().Write(storeKey, e.charge)
	if b == behCharge && w.hijacks(name) && p.hijackRespond(rw, e) {
		return // hijack.go
	}
	w.respond(rw, e)
}
