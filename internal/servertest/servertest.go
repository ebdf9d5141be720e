// Package servertest is the conformance suite of the server core's
// shells: the same scripted scenarios, with the same expected answers,
// run against idemserver.Middleware on every store (the memory store, the
// modelled store of internal/servermodel, PostgreSQL, Redis), against
// contrib/postgres's TxMiddleware, and against the modelled transactional
// shell (servermodel.TxServer). A shell passes when
//
//	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target { ... })
//
// succeeds with -race. The target serves app's business (what each
// request does is named by its X-Do header, see the Do constants):
// Streamed targets wrap app.Streamed(); Transactional ones map each
// behaviour onto their transaction (see App). It is internal: for this
// repository's tests only.
package servertest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servercore"
)

// The behaviours of App, named by a request's X-Do header.
const (
	// DoCharge makes one effect and answers 201 with the run's name.
	DoCharge = "charge"
	// DoFail answers 500 and makes no effect.
	DoFail = "fail"
	// DoGiveUp tells Started, waits for the client to leave, and answers
	// nothing (Transactional: after an effect in the transaction).
	DoGiveUp = "give-up"
	// DoHold makes one effect, tells Started, waits to be let go (Let),
	// and answers 201.
	DoHold = "hold"
	// DoCommitGoOn (Transactional only) makes one effect, commits it
	// with COMMIT AND CHAIN, tells Started, waits to be let go, and
	// answers 201.
	DoCommitGoOn = "commit-go-on"
	// DoCommitChain (Transactional only) makes one effect, commits it
	// with COMMIT AND CHAIN, and answers 201 at once.
	DoCommitChain = "commit-chain"
	// DoCommitAbort (Transactional only) makes one effect, commits it
	// with COMMIT AND CHAIN, then sends a statement that fails (the new
	// transaction aborted) and returns its error.
	DoCommitAbort = "commit-abort"
	// DoPanic panics.
	DoPanic = "panic"
	// DoBig makes one effect and answers 201 with a body larger than the
	// stored limit (Target.MaxStoredBody).
	DoBig = "big"
	// DoSwitch makes one effect and answers 101 Switching Protocols.
	DoSwitch = "switch"
)

// App is the business a target serves, and what it saw: the runs of each
// key (a Transactional target's effects count only when committed: see
// Target.Effects).
type App struct {
	// MaxStoredBody is the limit DoBig passes; the target's shell must be
	// set to it.
	MaxStoredBody int

	mu      sync.Mutex
	runs    map[string]int
	effects map[string]int // Streamed: effects are made as the handler runs
	started chan string
	hold    sync.Map // key → chan struct{}
}

// NewApp returns an App.
func NewApp() *App {
	return &App{MaxStoredBody: 1024, runs: map[string]int{}, effects: map[string]int{}, started: make(chan string, 64)}
}

// Key returns a request's idempotency key.
func Key(r *http.Request) string { return r.Header.Get("Idempotency-Key") }

// Do returns what a request asks the app to do.
func Do(r *http.Request) string { return r.Header.Get("X-Do") }

// Run counts a run of r's key and returns its name, which the response
// carries: a replay shows the first run's name, a second run another.
func (a *App) Run(r *http.Request) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runs[Key(r)]++
	return Key(r) + "#" + strconv.Itoa(a.runs[Key(r)])
}

// Runs returns how many times the handler ran for key.
func (a *App) Runs(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[key]
}

// Hold tells Started that r's run has made its effect, and waits until
// the suite lets it go, at most 20 s.
func (a *App) Hold(r *http.Request) {
	ch, _ := a.hold.LoadOrStore(Key(r), make(chan struct{}))
	a.started <- Key(r)
	select {
	case <-ch.(chan struct{}):
	case <-time.After(20 * time.Second):
	}
}

// Started tells the suite that r's run has begun (DoGiveUp).
func (a *App) Started(r *http.Request) { a.started <- Key(r) }

// let lets key's held run go.
func (a *App) let(key string) {
	ch, _ := a.hold.LoadOrStore(key, make(chan struct{}))
	close(ch.(chan struct{}))
}

// Answer writes the 201 of a run named run.
func Answer(w http.ResponseWriter, run string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"run":%q}`, run)
}

// Switch answers 101 Switching Protocols.
func Switch(w http.ResponseWriter) {
	w.Header().Set("Upgrade", "example/1")
	w.WriteHeader(http.StatusSwitchingProtocols)
}

// Big writes the 201 of a run too large to store.
func (a *App) Big(w http.ResponseWriter) {
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(strings.Repeat("x", a.MaxStoredBody+1)))
}

// Streamed returns the app as a plain handler, for idemserver.Middleware:
// its effects happen as it runs, and are counted by StreamedEffects.
func (a *App) Streamed() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		effect := func() {
			a.mu.Lock()
			a.effects[Key(r)]++
			a.mu.Unlock()
		}
		switch Do(r) {
		case DoFail:
			a.Run(r)
			w.WriteHeader(http.StatusInternalServerError)
		case DoGiveUp:
			a.Run(r)
			a.Started(r)
			<-r.Context().Done()
		case DoHold:
			run := a.Run(r)
			effect()
			a.Hold(r)
			Answer(w, run)
		case DoPanic:
			a.Run(r)
			panic(http.ErrAbortHandler)
		case DoBig:
			a.Run(r)
			effect()
			a.Big(w)
		case DoSwitch:
			a.Run(r)
			effect()
			Switch(w)
		default:
			run := a.Run(r)
			effect()
			Answer(w, run)
		}
	})
}

// StreamedEffects returns the effects Streamed made for key.
func (a *App) StreamedEffects(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.effects[key]
}

// Target is one shell with its store or database.
type Target struct {
	Mode servercore.Mode
	// Handler is the shell around the app, single tenant, with the
	// app's MaxStoredBody.
	Handler http.Handler
	// Effects returns the effects committed for key.
	Effects func(key string) int
	// RefuseComplete, when not nil, makes the store refuse its next n
	// Complete calls (see RefusingStore); Transactional: makes the
	// database refuse its next n stores of a record (the statement that
	// writes the response into the claim row fails, and the transaction
	// rolls back).
	RefuseComplete func(n int)
}

// Streamed returns the target of idemserver.Middleware on store,
// serving app.Streamed(), single tenant, with a lock timeout of 5 s; the
// store is wrapped in a RefusingStore.
func Streamed(app *App, store idemserver.Store) *Target {
	rs := &RefusingStore{Store: store}
	mw := &idemserver.Middleware{Store: rs, SingleTenant: true, MaxStoredBody: app.MaxStoredBody, LockTimeout: 5 * time.Second}
	return &Target{
		Mode:           servercore.Streamed,
		Handler:        mw.Wrap(app.Streamed()),
		Effects:        app.StreamedEffects,
		RefuseComplete: func(n int) { rs.Refuse.Store(int32(n)) },
	}
}

// RefusingStore is a Store that refuses the next Refuse calls of
// Complete without passing them on, as a store out of memory or a
// network blip would, and passes every other call to Store.
type RefusingStore struct {
	idemserver.Store
	Refuse atomic.Int32
}

// Complete refuses, or calls the store's.
func (s *RefusingStore) Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error {
	if s.Refuse.Add(-1) >= 0 {
		return errRefused
	}
	return s.Store.Complete(ctx, key, token, record, ttl)
}

var errRefused = fmt.Errorf("servertest: refused")

// reply is what a client saw.
type reply struct {
	Status   int
	Replayed bool
	Body     string
}

func (r reply) String() string {
	return fmt.Sprintf("%d replayed=%v %.80s", r.Status, r.Replayed, r.Body)
}

// send sends a keyed POST asking do, with body and content type, and
// returns what came back.
func send(h http.Handler, ctx context.Context, key, do, body, ct string) reply {
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body)).WithContext(ctx)
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-Do", do)
	if ct != "" {
		r.Header.Set("Content-Type", ct)
	}
	w := httptest.NewRecorder()
	func() {
		defer func() { _ = recover() }() // a panic goes on to net/http, which closes the connection
		h.ServeHTTP(w, r)
	}()
	return reply{Status: w.Code, Replayed: w.Header().Get(idemserver.ReplayedHeader) == "true", Body: w.Body.String()}
}

func created(run string) reply {
	return reply{Status: http.StatusCreated, Body: `{"run":"` + run + `"}`}
}

func replayed(run string) reply {
	r := created(run)
	r.Replayed = true
	return r
}

// Run runs the scenarios against the targets newTarget makes, one per
// scenario, each with its own App.
func Run(t *testing.T, newTarget func(t *testing.T, app *App) *Target) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			app := NewApp()
			tg := newTarget(t, app)
			if sc.mode != 0 && sc.mode != tg.Mode {
				t.Skipf("%s only", modeName(sc.mode))
			}
			if sc.needs != nil && !sc.needs(tg) {
				t.Skip("the target cannot make this fault")
			}
			sc.run(t, &fixture{t: t, app: app, tg: tg})
		})
	}
}

func modeName(m servercore.Mode) string {
	if m == servercore.Streamed {
		return "Streamed"
	}
	return "Transactional"
}

// fixture is one scenario's target and app.
type fixture struct {
	t   *testing.T
	app *App
	tg  *Target
}

func (f *fixture) send(key, do string) reply {
	return send(f.tg.Handler, context.Background(), key, do, "x", "")
}

// sendAsync sends in the background; the reply comes on the channel.
func (f *fixture) sendAsync(key, do string) <-chan reply {
	ch := make(chan reply, 1)
	go func() { ch <- f.send(key, do) }()
	return ch
}

// started waits for key's held run to have made its effect.
func (f *fixture) started(key string) {
	f.t.Helper()
	select {
	case got := <-f.app.started:
		require.Equal(f.t, key, got)
	case <-time.After(20 * time.Second):
		f.t.Fatal("the held run did not start")
	}
}

func (f *fixture) transactional() bool { return f.tg.Mode == servercore.Transactional }

type scenario struct {
	name  string
	mode  servercore.Mode    // 0: both
	needs func(*Target) bool // nil: every target
	run   func(t *testing.T, f *fixture)
}

// The scenarios. Each names the item it pins and the mutation of
// the core it was checked against.
var scenarios = []scenario{
	{name: "replay", run: func(t *testing.T, f *fixture) {
		assert.Equal(t, created("k#1"), f.send("k", DoCharge))
		assert.Equal(t, replayed("k#1"), f.send("k", DoCharge))
		assert.Equal(t, 1, f.tg.Effects("k"))
	}},

	{name: "in progress, then the replay", run: func(t *testing.T, f *fixture) {
		first := f.sendAsync("k", DoHold)
		f.started("k")
		got := f.send("k", DoCharge)
		assert.Equal(t, http.StatusConflict, got.Status, "%v", got)
		f.app.let("k")
		assert.Equal(t, created("k#1"), <-first)
		assert.Equal(t, replayed("k#1"), f.send("k", DoCharge))
		assert.Equal(t, 1, f.app.Runs("k"))
		assert.Equal(t, 1, f.tg.Effects("k"))
	}},

	{name: "another request under the key: 422", run: func(t *testing.T, f *fixture) {
		assert.Equal(t, created("k#1"), send(f.tg.Handler, context.Background(), "k", DoCharge, "x", ""))
		assert.Equal(t, http.StatusUnprocessableEntity, send(f.tg.Handler, context.Background(), "k", DoCharge, "y", "").Status)
	}},

	// Issue 30, §2.8. Checked to fail with the Content-Type left out of
	// the fingerprint: the second request got the first's response.
	{name: "another multipart boundary: 422", run: func(t *testing.T, f *fixture) {
		body := "--a\r\n\r\n--b\r\n\r\n1\r\n--b--\r\n--a--\r\n"
		first := send(f.tg.Handler, context.Background(), "k", DoCharge, body, "multipart/form-data; boundary=a")
		assert.Equal(t, created("k#1"), first)
		second := send(f.tg.Handler, context.Background(), "k", DoCharge, body, "multipart/form-data; boundary=b")
		assert.Equal(t, http.StatusUnprocessableEntity, second.Status, "%v", second)
		same := send(f.tg.Handler, context.Background(), "k", DoCharge, body, "Multipart/Form-Data;boundary=a")
		assert.Equal(t, replayed("k#1"), same, "the same request, spelt another way")
	}},

	{name: "server error: released", run: func(t *testing.T, f *fixture) {
		assert.Equal(t, http.StatusInternalServerError, f.send("k", DoFail).Status)
		assert.Equal(t, created("k#2"), f.send("k", DoCharge))
		assert.Equal(t, 1, f.tg.Effects("k"))
	}},

	// Issue 30, §2.3: the same answer in every mode. Checked to fail
	// with the core's rule 3 dropped: TxMiddleware stored an empty 200,
	// which the retry got back.
	{name: "the client left, nothing written: released, nothing stored", run: func(t *testing.T, f *fixture) {
		ctx, cancel := context.WithCancel(context.Background())
		gone := make(chan reply, 1)
		go func() { gone <- send(f.tg.Handler, ctx, "k", DoGiveUp, "x", "") }()
		f.started("k")
		cancel()
		<-gone
		assert.Equal(t, created("k#2"), f.send("k", DoCharge), "a retry runs")
		assert.Equal(t, 1, f.tg.Effects("k"))
	}},

	{name: "panic: released", run: func(t *testing.T, f *fixture) {
		f.send("k", DoPanic)
		assert.Equal(t, created("k#2"), f.send("k", DoCharge))
		assert.Equal(t, 1, f.tg.Effects("k"))
	}},

	// Issue 30, §2.5. Checked to fail (TxMiddleware) with a busy lock
	// answered 409 before the completed row was read.
	{name: "many retries of a completed key at once: the replay, never 409", run: func(t *testing.T, f *fixture) {
		assert.Equal(t, created("k#1"), f.send("k", DoCharge))
		const n = 16
		replies := make(chan reply, n)
		var start sync.WaitGroup
		start.Add(1)
		for range n {
			go func() {
				start.Wait()
				replies <- f.send("k", DoCharge)
			}()
		}
		start.Done()
		for range n {
			assert.Equal(t, replayed("k#1"), <-replies)
		}
		assert.Equal(t, 1, f.app.Runs("k"))
	}},

	// Issue 30, §2.6: a store that refuses one Complete does not make
	// the retry run the handler again. Checked to fail with Complete
	// tried once: the key stayed claimed (409), then ran again.
	{name: "a Complete refused once: stored all the same", mode: servercore.Streamed,
		needs: func(tg *Target) bool { return tg.RefuseComplete != nil },
		run: func(t *testing.T, f *fixture) {
			f.tg.RefuseComplete(1)
			assert.Equal(t, created("k#1"), f.send("k", DoCharge))
			assert.Equal(t, replayed("k#1"), f.send("k", DoCharge))
			assert.Equal(t, 1, f.app.Runs("k"))
		}},

	// Issue 30, §2.1. Checked to fail (TxMiddleware) with the claim
	// row taken over while in progress, as when only the transaction's
	// lock held the key: the duplicate ran, then was replayed.
	{name: "a handler that commits and goes on: 409 meanwhile, 410 after", mode: servercore.Transactional,
		run: func(t *testing.T, f *fixture) {
			first := f.sendAsync("k", DoCommitGoOn)
			f.started("k")
			dup := f.send("k", DoCharge)
			assert.Equal(t, http.StatusConflict, dup.Status, "%v", dup)
			f.app.let("k")
			got := <-first
			assert.Equal(t, http.StatusInternalServerError, got.Status, "%v", got)
			assert.Contains(t, got.Body, "TypeTxEnded")
			after := f.send("k", DoCharge)
			assert.Equal(t, http.StatusGone, after.Status, "%v", after)
			assert.Equal(t, 1, f.app.Runs("k"))
			assert.Equal(t, 1, f.tg.Effects("k"), "the part it committed")
		}},

	// Issue 32 §1.3: a 101 after the effect. Checked to fail (the
	// modelled transactional shell) with its writer dropping a 101 as
	// an informational 1xx: the transaction committed and the key was
	// stored as a 200, which the retry got replayed.
	{name: "101 Switching Protocols after the effect", run: func(t *testing.T, f *fixture) {
		got := f.send("k", DoSwitch)
		if f.transactional() {
			// It cannot wait for the commit: rolled back, nothing ran.
			assert.Equal(t, http.StatusInternalServerError, got.Status, "%v", got)
			assert.Equal(t, created("k#2"), f.send("k", DoCharge))
		} else {
			// It ran and took the connection: kept, not replayable.
			assert.Equal(t, http.StatusSwitchingProtocols, got.Status, "%v", got)
			assert.Equal(t, http.StatusGone, f.send("k", DoCharge).Status)
		}
		assert.Equal(t, 1, f.tg.Effects("k"))
	}},

	// Issue 32, §1.3 (the simulator's bugOwnRow409, seed 9714): the
	// look at the key after the rollback finds the request's own claim
	// row, which the handler's COMMIT committed, and must not take it for
	// another request's. Checked to fail with Rechecked's own-token case
	// removed: the first answer was 409, as for a duplicate.
	{name: "a handler that commits itself, then its store refused: 500, then 410", mode: servercore.Transactional,
		needs: func(tg *Target) bool { return tg.RefuseComplete != nil },
		run: func(t *testing.T, f *fixture) {
			f.tg.RefuseComplete(1)
			got := f.send("k", DoCommitChain)
			assert.Equal(t, http.StatusInternalServerError, got.Status, "the ended transaction's answer, never 409: %v", got)
			assert.Contains(t, got.Body, "TypeTxEnded")
			after := f.send("k", DoCharge)
			assert.Equal(t, http.StatusGone, after.Status, "kept, not replayable: %v", after)
			assert.Equal(t, 1, f.app.Runs("k"), "never a second run")
			assert.Equal(t, 1, f.tg.Effects("k"), "the part it committed")
		}},

	// The same look at the key, after a handler's error in the
	// transaction it began with COMMIT AND CHAIN, which a failed
	// statement left aborted (the rollback cannot tell it from the
	// claim's): its own claim row is found, and the key kept. Checked to
	// fail with Rechecked's own-token case removed: 409, and 409 for the
	// TTL after.
	{name: "a handler that commits itself, then fails in an aborted transaction: 500, then 410", mode: servercore.Transactional,
		run: func(t *testing.T, f *fixture) {
			got := f.send("k", DoCommitAbort)
			assert.Equal(t, http.StatusInternalServerError, got.Status, "the ended transaction's answer, never 409: %v", got)
			assert.Contains(t, got.Body, "TypeTxEnded")
			after := f.send("k", DoCharge)
			assert.Equal(t, http.StatusGone, after.Status, "kept, not replayable: %v", after)
			assert.Equal(t, 1, f.app.Runs("k"), "never a second run")
			assert.Equal(t, 1, f.tg.Effects("k"), "the part it committed")
		}},

	{name: "too large to store", run: func(t *testing.T, f *fixture) {
		got := f.send("k", DoBig)
		if f.transactional() {
			// Nothing was sent: roll back, so that nothing ran.
			assert.Equal(t, http.StatusInternalServerError, got.Status)
			assert.Equal(t, created("k#2"), f.send("k", DoCharge))
		} else {
			// Sent whole: it ran, so its key is kept, not replayable.
			assert.Equal(t, http.StatusCreated, got.Status)
			assert.Equal(t, http.StatusGone, f.send("k", DoCharge).Status)
		}
		assert.Equal(t, 1, f.tg.Effects("k"))
	}},
}
