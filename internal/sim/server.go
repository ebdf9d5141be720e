//go:build go1.26

package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
)

// The server side. The code that runs is idemserver.Middleware, net/http's
// http.Server and a business handler; what is modelled is the database
// under them: a store that keeps the middleware's claims and records and
// a ledger that keeps the business's effects, both of which outlive every
// server process. The store is the atomic mode's (contrib/postgres's
// TxMiddleware): a claim lives as long as the process that holds it (the
// advisory lock of a transaction dies with its connection), the handler's
// effect is staged in the claim (written in the transaction), and
// Complete commits the effect and the stored response together, or
// neither: a server that crashes at any point leaves both or none. The
// response leaves net/http's buffer only after the handler, and so the
// commit, returned. The real TxMiddleware is tested against PostgreSQL,
// its crash tests included, in contrib/postgres.

// effect is one charge the business made.
type effect struct {
	op     int
	key    string // the request's idempotency key
	charge string
	body   []byte    // the response the handler produced
	server int       // the server process that ran it
	at     time.Time // when (the server's clock)
}

// ledger is the business's database: committed effects, in order.
type ledger struct {
	mu      sync.Mutex
	effects []*effect
	charges int // charge numbers drawn, committed or not
}

func (l *ledger) newCharge(op int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charges++
	return fmt.Sprintf("ch-%d-%d", op, l.charges)
}

func (l *ledger) commit(e *effect) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.effects = append(l.effects, e)
}

// of returns the effects of op, in commit order.
func (l *ledger) of(op int) []*effect {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*effect
	for _, e := range l.effects {
		if e.op == op {
			out = append(out, e)
		}
	}
	return out
}

// byCharge returns the effect that made charge, nil if none committed.
func (l *ledger) byCharge(charge string) *effect {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.effects {
		if e.charge == charge {
			return e
		}
	}
	return nil
}

// byKey returns the effects made under key.
func (l *ledger) byKey(key string) []*effect {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*effect
	for _, e := range l.effects {
		if e.key == key {
			out = append(out, e)
		}
	}
	return out
}

// record is a stored response: durable.
type record struct {
	fingerprint string
	data        []byte
	expires     time.Time
}

// claim is an in-progress claim: it lives with its server process.
type claim struct {
	token, fingerprint string
	expires            time.Time
	proc               int
	staged             *effect // the effect its handler wrote, committed with the record
}

// store is the idempotency store of the atomic mode.
type store struct {
	w       *world
	mu      sync.Mutex
	records map[string]record
	claims  map[string]*claim
}

func newStore(w *world) *store {
	return &store{w: w, records: map[string]record{}, claims: map[string]*claim{}}
}

// errServerGone is what a store call of a dead server process gets: its
// connection to the database went with it.
var errServerGone = errors.New("sim: the server process is gone")

// view is the store as server process proc reaches it: an
// idemserver.Store.
type view struct {
	s    *store
	proc *serverProc
}

var _ idemserver.Store = view{}

func (v view) Claim(_ context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if v.proc.dead.Load() {
		return idemserver.ClaimResult{}, errServerGone
	}
	now := time.Now()
	if r, ok := s.records[key]; ok && now.Before(r.expires) {
		return idemserver.ClaimResult{State: idemserver.Completed, Fingerprint: r.fingerprint, Record: r.data}, nil
	}
	if cl, ok := s.claims[key]; ok && now.Before(cl.expires) {
		return idemserver.ClaimResult{State: idemserver.InProgress, Fingerprint: cl.fingerprint}, nil
	}
	s.claims[key] = &claim{token: c.Token, fingerprint: c.Fingerprint, expires: now.Add(c.LockTimeout), proc: v.proc.n}
	return idemserver.ClaimResult{State: idemserver.Claimed}, nil
}

// heldLocked returns key's live claim held by token.
func (v view) heldLocked(key, token string) (*claim, error) {
	if v.proc.dead.Load() {
		return nil, errServerGone
	}
	cl, ok := v.s.claims[key]
	if !ok || cl.token != token || !time.Now().Before(cl.expires) {
		return nil, idemserver.ErrClaimLost
	}
	return cl, nil
}

func (v view) Renew(_ context.Context, key, token string, lockTimeout time.Duration) error {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	cl, err := v.heldLocked(key, token)
	if err != nil {
		return err
	}
	cl.expires = time.Now().Add(lockTimeout)
	return nil
}

// Complete commits the claim's staged effect and the record at once: the
// transaction's COMMIT. The server may crash just before it (nothing is
// committed) or just after (both are).
func (v view) Complete(_ context.Context, key, token string, data []byte, ttl time.Duration) error {
	if v.s.w.serverPoint(v.proc, "commit.before") {
		return errServerGone
	}
	v.s.mu.Lock()
	cl, err := v.heldLocked(key, token)
	if err != nil {
		v.s.mu.Unlock()
		return err
	}
	delete(v.s.claims, key)
	v.s.records[key] = record{fingerprint: cl.fingerprint, data: data, expires: time.Now().Add(ttl)}
	if cl.staged != nil && !bugSplitCommit {
		v.s.w.ledger.commit(cl.staged)
	}
	v.s.mu.Unlock()
	v.s.w.serverPoint(v.proc, "commit.after")
	return nil
}

// Release rolls the claim back, its staged effect with it.
func (v view) Release(_ context.Context, key, token string) error {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	if _, err := v.heldLocked(key, token); err != nil {
		return err
	}
	delete(v.s.claims, key)
	return nil
}

// stage writes e in the transaction of key's claim, which server process
// p holds: it commits with the claim's record. With the split-commit bug
// planted (bugSplitCommit), it commits at once instead, outside the
// record's transaction, as a handler that writes the effect in its own
// transaction does.
func (s *store) stage(p *serverProc, key string, e *effect) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.dead.Load() {
		return false
	}
	cl, ok := s.claims[key]
	if !ok || cl.proc != p.n {
		return false
	}
	if bugSplitCommit {
		s.w.ledger.commit(e)
	}
	cl.staged = e
	return true
}

// dropClaims forgets server process p's claims: its transactions died
// with it, and their effects were never committed.
func (s *store) dropClaims(p int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, cl := range s.claims {
		if cl.proc == p {
			delete(s.claims, k)
		}
	}
}

// serverProc is one run of the server process.
type serverProc struct {
	w    *world
	n    int
	srv  *http.Server
	ln   *listener
	dead atomic.Bool
	done chan struct{} // Serve returned
}

// chargeRequest is the business's request body.
type chargeRequest struct {
	Op     int `json:"op"`
	Amount int `json:"amount"`
}

// chargeResponse is its response body.
type chargeResponse struct {
	Op     int    `json:"op"`
	Charge string `json:"charge"`
}

// startServer starts server process number n.
func (w *world) startServer() *serverProc {
	w.srvN++
	p := &serverProc{w: w, n: w.srvN, ln: newListener(), done: make(chan struct{})}
	mw := &idemserver.Middleware{
		Store:        view{s: w.store, proc: p},
		SingleTenant: true,
		Required:     true,
		LockTimeout:  3 * time.Second,
		RetryAfter:   time.Second,
		Logger:       slog.New(slog.DiscardHandler),
	}
	inner := mw.Wrap(http.HandlerFunc(p.charge)) // panics on a misconfigured world
	p.srv = &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			w.route(p, inner, rw, r)
			// The response is still in net/http's buffer: a crash
			// here loses it, after the commit.
			w.serverPoint(p, "response.before")
		}),
		ErrorLog: log.New(io.Discard, "", 0),
	}
	w.net.mu.Lock()
	w.net.ln[p.n] = p.ln
	w.net.up = p.n
	w.net.mu.Unlock()
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(p.ln)
	}()
	w.mu.Lock()
	w.srv = p
	w.mu.Unlock()
	w.tracef("server %d up", p.n)
	return p
}

// charge is the business handler: it charges once per request it runs,
// writing the effect in the request's transaction.
func (p *serverProc) charge(rw http.ResponseWriter, r *http.Request) {
	w := p.w
	var req chargeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(rw, "bad request", http.StatusBadRequest)
		return
	}
	key, err := idemserver.ParseKey(r.Header.Get("Idempotency-Key"), idemserver.KeyFormAny)
	if err != nil {
		http.Error(rw, "bad key", http.StatusBadRequest)
		return
	}
	if w.serverPoint(p, "handler.start") || w.pause(p, req.Op, key) {
		return
	}
	charge := w.ledger.newCharge(req.Op)
	body, _ := json.Marshal(chargeResponse{Op: req.Op, Charge: charge})
	e := &effect{op: req.Op, key: key, charge: charge, body: body, server: p.n, at: time.Now()}
	if !w.store.stage(p, idemserver.ScopedKey("", key), e) {
		return // the claim is gone: the process is
	}
	if w.serverPoint(p, "handler.effect") {
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	if w.modes[req.Op] == modeSeeOther {
		// Post/Redirect/Get: the charge is made, and the answer points
		// at it.
		rw.Header().Set("Location", "/v1/charges/"+charge)
		rw.WriteHeader(http.StatusSeeOther)
		_, _ = rw.Write(body)
		return
	}
	rw.WriteHeader(http.StatusOK)
	_, _ = rw.Write(body)
}

// How the server answers an operation's URL (Config.Redirect): servers
// that redirect, before the request reaches the business (a router's
// redirect: nothing runs) or after it ran (Post/Redirect/Get).
const (
	modePlain    = iota // POST /v1/charges: 200
	modeOld             // POST /v1/old/charges: 307 to /v1/charges, the same origin
	modeMoved           // POST /v1/moved/charges: 308 to /v1/charges
	modeAway            // POST /v1/away/charges: 307 to another origin, which the client must not follow with a key
	modeSeeOther        // POST /v1/charges: the charge is made, then 303 to GET /v1/charges/<charge>
	numModes
)

var modePaths = [numModes]string{"/v1/charges", "/v1/old/charges", "/v1/moved/charges", "/v1/away/charges", "/v1/charges"}

var modeNames = [numModes]string{"plain", "307 same origin", "308 same origin", "307 to another origin", "303 after the charge"}

// route is the server's router: redirects in front of the middleware,
// the charges' own resource behind none (a GET needs no key).
func (w *world) route(p *serverProc, inner http.Handler, rw http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/charges/"):
		charge := strings.TrimPrefix(r.URL.Path, "/v1/charges/")
		e := w.ledger.byCharge(charge)
		if e == nil {
			http.NotFound(rw, r)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(e.body)
	case r.URL.Path == modePaths[modeOld]:
		http.Redirect(rw, r, modePaths[modePlain], http.StatusTemporaryRedirect)
	case r.URL.Path == modePaths[modeMoved]:
		http.Redirect(rw, r, modePaths[modePlain], http.StatusPermanentRedirect)
	case r.URL.Path == modePaths[modeAway]:
		host, _, _ := strings.Cut(r.Host, ".")
		http.Redirect(rw, r, w.scheme()+"://"+host+"-away.sim"+modePaths[modePlain], http.StatusTemporaryRedirect)
	default:
		inner.ServeHTTP(rw, r)
	}
}

// gate is a handler held by the driver: while it waits, a retry with its
// key meets its claim (409), and the server may crash under it.
type gate struct {
	proc *serverProc
	op   int
	key  string
	seq  int
	ch   chan struct{}
	once sync.Once
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// pause holds the handler, when the seed says so, until the driver
// releases it; it reports whether the process died meanwhile.
func (w *world) pause(p *serverProc, op int, key string) bool {
	if !w.faulty.Load() || !w.srng.pick(w.cfg.Pause) {
		return p.dead.Load()
	}
	w.mu.Lock()
	w.gateSeq++
	g := &gate{proc: p, op: op, key: key, seq: w.gateSeq, ch: make(chan struct{})}
	w.gates = append(w.gates, g)
	w.mu.Unlock()
	<-g.ch
	return p.dead.Load()
}

// serverPoint is a point a request passes on server process p: the seed
// may crash the process there. It reports whether p is dead.
func (w *world) serverPoint(p *serverProc, where string) bool {
	if p.dead.Load() {
		return true
	}
	if !w.faulty.Load() || w.serverCrashesLeft() <= 0 || !w.srng.pick(w.cfg.ServerPoint) {
		return false
	}
	w.crashServer(p, where)
	return true
}

// crashServer kills server process p: its claims (and the effects they
// staged) are gone, its connections reset, its handlers stopped.
func (w *world) crashServer(p *serverProc, where string) {
	if !p.dead.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	w.serverCrashes++
	w.stats["server crash at "+where]++
	gates := w.gates
	w.gates = nil
	w.mu.Unlock()
	w.tracef("server %d crashes at %s", p.n, where)
	w.store.dropClaims(p.n)
	w.net.serverDown(p.n)
	for _, g := range gates {
		if g.proc == p {
			g.open()
		} else {
			w.mu.Lock()
			w.gates = append(w.gates, g)
			w.mu.Unlock()
		}
	}
	w.mu.Lock()
	if w.srv == p {
		w.srv = nil
	}
	w.serverDownSince = time.Now()
	w.mu.Unlock()
	go func() { _ = p.srv.Close() }()
}
