//go:build go1.26

package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servermodel"
)

// The server side. What runs is the server core (internal/servercore)
// in one of its two shells, drawn per seed (Config.Shell), net/http's
// http.Server and a business handler; what is modelled is the database
// under them (internal/servermodel), which outlives every server
// process:
//
//   - shellTx: the transactional shell (servermodel.TxServer, the steps of
//     contrib/postgres's TxMiddleware) over the modelled transactional
//     database: the handler writes its charge in the request's
//     transaction, which commits with the stored response, or rolls
//     back; it may also commit early and keep working, fail, leave the
//     transaction aborted, give up when its client leaves, or panic
//     (server_tx.go).
//   - shellStreamed: idemserver.Middleware over the modelled Store, the
//     business writing its charge to the database as the handler runs
//     (server_streamed.go).
//
// One or two server processes are up at once, behind one address, each
// with its own connections to the one database; requests come from one
// to three tenants (a Principal). The database's store may refuse a call,
// run out of memory, lose its answer, hang (the transactional world), or
// be cut off for a while; its clock may jump (server_faults.go).
//
// The ledger the invariants read is the database's own: the effects that
// committed (servermodel.DB.Effects), so that "ran twice" means two
// committed charges.

// effect is one charge a handler drew, committed or not: the ledger
// knows which committed.
type effect struct {
	op       int
	key      string // the request's idempotency key
	storeKey string // the key in the tenant's scope
	charge   string
	body     []byte    // the response the handler produces
	server   int       // the server process that ran it
	at       time.Time // when (the world's clock)
}

// ledger is the business's database, as the invariants read it: the
// charges the database committed (servermodel.DB's ledger), with what
// each handler drew for them. The zero value is an empty database.
type ledger struct {
	mu      sync.Mutex
	db      *servermodel.DB
	drawn   map[string]*effect // by charge
	charges int                // charge numbers drawn, committed or not
}

// database returns the business's database.
func (l *ledger) database() *servermodel.DB {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.db == nil {
		l.db = &servermodel.DB{}
	}
	return l.db
}

// newCharge draws the next charge of op and keeps what the handler makes
// of it (e, whose charge it sets).
func (l *ledger) newCharge(e *effect) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.charges++
	e.charge = fmt.Sprintf("ch-%d-%d", e.op, l.charges)
	e.body, _ = json.Marshal(chargeResponse{Op: e.op, Charge: e.charge})
	if l.drawn == nil {
		l.drawn = map[string]*effect{}
	}
	l.drawn[e.charge] = e
}

// commit commits e at once, outside any transaction (for the checks'
// own tests).
func (l *ledger) commit(e *effect) {
	db := l.database()
	l.mu.Lock()
	if l.drawn == nil {
		l.drawn = map[string]*effect{}
	}
	l.drawn[e.charge] = e
	l.mu.Unlock()
	k := e.storeKey
	if k == "" {
		k = e.key
	}
	db.Write(k, e.charge)
}

// effects returns the committed effects, in commit order.
func (l *ledger) effects() []*effect {
	committed := l.database().Effects()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*effect, 0, len(committed))
	for _, c := range committed {
		if e := l.drawn[c.Name]; e != nil {
			out = append(out, e)
		}
	}
	return out
}

// of returns the effects of op, in commit order.
func (l *ledger) of(op int) []*effect {
	var out []*effect
	for _, e := range l.effects() {
		if e.op == op {
			out = append(out, e)
		}
	}
	return out
}

// byCharge returns the effect that made charge, nil if none committed.
func (l *ledger) byCharge(charge string) *effect {
	for _, e := range l.effects() {
		if e.charge == charge {
			return e
		}
	}
	return nil
}

// byKey returns the effects made under key.
func (l *ledger) byKey(key string) []*effect {
	var out []*effect
	for _, e := range l.effects() {
		if e.key == key {
			out = append(out, e)
		}
	}
	return out
}

// errServerGone is what a store call of a dead server process gets: its
// connection to the database went with it.
var errServerGone = errors.New("sim: the server process is gone")

// serverProc is one run of a server process.
type serverProc struct {
	w    *world
	n    int
	srv  *http.Server
	ln   *listener
	dead atomic.Bool
	done chan struct{} // Serve returned
	// open counts its requests (Streamed) between their charge and the
	// end of their store calls: a crash there leaves a charge without a
	// record, which no store beside the business's database can help
	// (the non-atomic mode; see crashable).
	open atomic.Int64
	// off is the process's own clock's offset from virtual time: its
	// jumps (server_clock.go).
	off atomic.Int64
}

// reqState is a request's, as the server's router sees it.
type reqState struct {
	id      string // its connection, and its number on it: a name no scheduling changes
	runs    int    // runs of its handler so far (a serialization failure runs it again)
	charged bool   // the handler charged (Streamed: at once)
}

// run names a run of r's handler, for the seed's draws: a name no
// scheduling changes (see world.draw), so that two server goroutines
// woken at one instant (the resets of a client process that died, ending
// the waits of handlers that give up) draw the same whatever order they
// run in.
func run(r *http.Request) string {
	rs, ok := r.Context().Value(reqKey{}).(*reqState)
	if !ok {
		return "?"
	}
	rs.runs++
	return fmt.Sprintf("%s/%d", rs.id, rs.runs)
}

type reqKey struct{}

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

// The shells (Config.Shell).
const (
	shellTx       = iota // servermodel.TxServer over servermodel.DB
	shellStreamed        // idemserver.Middleware over servermodel.Store
	numShells
)

var shellNames = [numShells]string{"transactional", "streamed"}

// tenantHeader names the request's tenant, which the Principal reads.
const tenantHeader = "X-Sim-Tenant"

// tenantOf is op's tenant.
func (w *world) tenantOf(op int) string {
	if w.cfg.Tenants < 2 {
		return ""
	}
	return "t" + strconv.Itoa(op%w.cfg.Tenants)
}

// principal is the servers' Principal: the tenant the request names.
func principal(r *http.Request) string { return r.Header.Get(tenantHeader) }

// lockTimeout is idemserver.Middleware's, dbTimeout the transactional
// shell's bound on each of its statements.
const (
	lockTimeout = 3 * time.Second
	dbTimeout   = 2 * time.Second
)

// startServer starts server process number n, on the world's database.
func (w *world) startServer() *serverProc {
	w.srvN++
	p := &serverProc{w: w, n: w.srvN, ln: newListener(), done: make(chan struct{})}
	var inner http.Handler
	if w.cfg.Shell == shellStreamed {
		inner = w.streamedShell(p)
	} else {
		inner = w.txShell(p)
	}
	p.srv = &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			conn := fmt.Sprint(r.Context().Value(http.LocalAddrContextKey))
			w.mu.Lock()
			w.connReqs[conn]++
			rs := &reqState{id: fmt.Sprintf("%s#%d", conn, w.connReqs[conn])}
			w.mu.Unlock()
			w.route(p, inner, rw, r.WithContext(context.WithValue(r.Context(), reqKey{}, rs)))
			// The response is still in net/http's buffer: a crash
			// here loses it, after the commit.
			w.serverPoint(p, "response.before", rs.id)
		}),
		ErrorLog: log.New(io.Discard, "", 0),
	}
	w.net.mu.Lock()
	w.net.ln[p.n] = p.ln
	w.net.ups = append(w.net.ups, p.n)
	w.net.mu.Unlock()
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(p.ln)
	}()
	w.mu.Lock()
	w.srvs = append(w.srvs, p)
	w.mu.Unlock()
	w.tracef("server %d up", p.n)
	return p
}

// servers returns the server processes up, in the order they started.
func (w *world) servers() []*serverProc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.srvs)
}

// instances is how many server processes the world keeps up.
func (w *world) instances() int { return max(1, w.cfg.Instances) }

// crashable returns the server processes the driver may crash now: in
// the streamed world, only those with no request between its charge and
// the end of its store calls. There, the charge is the business's and the
// record the store's, two commits: a crash between them leaves the
// charge with the claim, which expires, and the retry charges again.
// That is the non-atomic mode's known limit (docs/server.md), not what
// the invariants hold a server to; the planted split-commit bug shows the
// world catches it where the mode claims atomicity.
func (w *world) crashable() []*serverProc {
	var out []*serverProc
	for _, p := range w.servers() {
		if w.cfg.Shell != shellStreamed || p.open.Load() == 0 {
			out = append(out, p)
		}
	}
	return out
}

// opOfRequest reads the operation from the request's host ("op<N>.sim"),
// the one part of the request every shell leaves as it came.
func opOfRequest(r *http.Request) (int, bool) {
	host, _, _ := strings.Cut(r.Host, ".")
	op, err := strconv.Atoi(strings.TrimPrefix(host, "op"))
	return op, err == nil && strings.HasPrefix(host, "op")
}

// requestKey reads the request's idempotency key, and its key in the
// tenant's scope, as the shells do.
func (w *world) requestKey(r *http.Request) (key, storeKey string, ok bool) {
	key, err := idemserver.ParseKey(r.Header.Get("Idempotency-Key"), idemserver.KeyFormAny)
	if err != nil {
		return "", "", false
	}
	scope := ""
	if w.cfg.Tenants >= 2 {
		scope = principal(r)
	}
	return key, idemserver.ScopedKey(scope, key), true
}

// big makes e's answer larger than the stored limit.
func big(e *effect) {
	e.body, _ = json.Marshal(struct {
		chargeResponse
		Pad string `json:"pad"`
	}{chargeResponse{Op: e.op, Charge: e.charge}, strings.Repeat("x", maxStored)})
}

// respond writes the charge's answer: 200 with the charge, or, for an
// operation whose server answers Post/Redirect/Get, 303 to it.
func (w *world) respond(rw http.ResponseWriter, e *effect) {
	rw.Header().Set("Content-Type", "application/json")
	if w.modes[e.op] == modeSeeOther {
		rw.Header().Set("Location", "/v1/charges/"+e.charge)
		rw.WriteHeader(http.StatusSeeOther)
		_, _ = rw.Write(e.body)
		return
	}
	rw.WriteHeader(http.StatusOK)
	_, _ = rw.Write(e.body)
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
		rs, _ := r.Context().Value(reqKey{}).(*reqState)
		defer func() {
			if rs != nil && rs.charged {
				p.open.Add(-1)
			}
		}()
		inner.ServeHTTP(rw, r)
	}
}

// The handlers' behaviours (Config.Behave): what a run does besides, or
// instead of, charging and answering.
const (
	behCharge    = iota // charge, answer 200 (or 303)
	behFail             // fail: Transactional, an error after the charge (rolled back); Streamed, 500 before it
	behGiveUp           // wait for the client to leave, answer nothing (Transactional: after the charge)
	behPanic            // panic (Transactional: after the charge)
	behCommit           // Transactional: charge, COMMIT, go on, answer 200
	behChain            // Transactional: charge, COMMIT AND CHAIN, go on, answer 200
	behAbort            // Transactional: charge, a statement fails (the transaction aborted), answer 200 all the same
	behSerialize        // Transactional: charge, then a serialization failure (rolled back; the core runs it again)
	behBig              // charge, answer 200 with a body over the stored limit (Transactional: rolled back, 500; Streamed: sent whole, the key kept not replayable)
	numBehaviours
)

var behaviourNames = [numBehaviours]string{"charges", "fails", "gives up when its client leaves", "panics", "commits and goes on", "commits and chains", "leaves its transaction aborted", "fails to serialize", "answers more than the stored limit"}

// The behaviours each shell's handlers draw from.
var (
	txBehaviours       = []int{behFail, behGiveUp, behPanic, behCommit, behChain, behAbort, behSerialize, behBig}
	streamedBehaviours = []int{behFail, behGiveUp, behPanic, behBig}
)

// maxStored is both shells' MaxStoredBody: a charge's answer is far
// below it, a behBig one above.
const maxStored = 512

// behaviour draws what the handler run named name, of op, does.
func (w *world) behaviour(p *serverProc, op int, key, name string) int {
	if !w.faulty.Load() || w.draw(100, "behave", name) >= w.cfg.Behave {
		return behCharge
	}
	bs := txBehaviours
	if w.cfg.Shell == shellStreamed {
		bs = streamedBehaviours // fail, give up or panic before they charge
	}
	b := bs[w.draw(len(bs), "behaviour", name)]
	w.count("handler " + behaviourNames[b])
	w.tracef("server %d: the handler of op %d key %s %s", p.n, op, key, behaviourNames[b])
	return b
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

// pause holds the handler run named name, when the seed says so, until
// the driver releases it; it reports whether the process died meanwhile.
func (w *world) pause(p *serverProc, op int, key, name string) bool {
	if !w.faulty.Load() || w.draw(100, "pause", name) >= w.cfg.Pause {
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

// serverPoint is a point where a request (named name: see run) passes
// on server process p: the seed may crash the process there. It reports
// whether p is dead.
func (w *world) serverPoint(p *serverProc, where, name string) bool {
	if p.dead.Load() {
		return true
	}
	if !w.faulty.Load() || w.serverCrashesLeft() <= 0 || w.draw(100, "crash", where, name) >= w.cfg.ServerPoint {
		return false
	}
	if w.cfg.Shell == shellStreamed && p.open.Load() > 0 {
		return false // see crashable
	}
	w.crashServer(p, where)
	return true
}

// crashServer kills server process p: its connections to the database
// end (the transactional world's open transactions roll back, their
// locks with them; the streamed world's claims stay in the store until
// their lock times out), its clients' connections reset, its handlers
// stopped.
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
	if w.cfg.Shell != shellStreamed {
		w.ledger.database().Drop(p.pool())
	}
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
	w.srvs = slices.DeleteFunc(w.srvs, func(x *serverProc) bool { return x == p })
	w.serverDownSince = time.Now()
	w.mu.Unlock()
	go func() { _ = p.srv.Close() }()
}

// pool names p's connections to the database.
func (p *serverProc) pool() string { return "server-" + strconv.Itoa(p.n) }
