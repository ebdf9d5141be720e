//go:build go1.26

package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/internal/simkey"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// The client side: a batch job, on one machine or on each machine of a
// fleet. Each run of its process opens the journal (a filejournal.Journal
// on the machine's simulated disk, or its worker on the fleet's journal),
// resends what the journal holds pending (Client.Resume; in a fleet, what
// it claims) and runs the batch, one call of Client.Do per listed
// operation, a few at a time, through one of the process's Clients: a
// named operation with WithOperation, so that a rerun reuses its key; an
// unnamed one with neither an operation id nor a key, which the client
// mints. All of it is the project's own code; the job around it is what a
// batch program does.

// journalPath is the journal on the simulated disk.
const journalPath = "/var/lib/batch/payments.journal"

// clientProc is one run of the client process on a machine.
type clientProc struct {
	w       *world
	m       *machine
	n       int // numbered across the world's machines
	dead    atomic.Bool
	exiting bool // the job stops starting calls: its journal failed
	gone    bool // die ran: files, sockets and journal closed
	j       *filejournal.Journal
	fj      *fleetJournal // in a fleet, the process's worker
	rec     *recJournal
	cs      []*idemhttp.Client // Config.Clients, sharing the journal
	hcs     []*http.Client     // theirs, one each
	trs     []*http.Transport  // their pools, one each
	queue   []int              // operations still to call, in order
	busy    int                // calls in flight
	resume  *call              // Resume's run, while it runs
	resumed bool               // Resume returned
	jerr    atomic.Bool
	scan    map[string]idemhttp.State // the journal as the process opened it
	// ctx is the process's: its calls' contexts derive from it, and die
	// cancels it, so that a call of a dead process waiting for a slot or
	// a timer ends (the process is gone; its goroutines, which the
	// simulation cannot stop, must not outlive the world).
	ctx    context.Context
	cancel context.CancelFunc
}

// procFS is the disk as a client process sees it: once the process is
// dead, it does nothing (a dead process's goroutines, which the
// simulation cannot stop, must not reach the disk the next run uses).
type procFS struct {
	d *simdisk.Disk
	p *clientProc
}

var errDead = errors.New("sim: the process is dead")

func (f procFS) check(op, name string) error {
	if f.p.dead.Load() {
		return &os.PathError{Op: op, Path: name, Err: errDead}
	}
	return nil
}

func (f procFS) OpenFile(name string, flag int, perm os.FileMode, dsync bool) (filejournal.File, error) {
	if err := f.check("open", name); err != nil {
		return nil, err
	}
	file, err := f.d.OpenFile(name, flag, perm, dsync)
	f.halted()
	if err != nil {
		return nil, err
	}
	return procFile{File: file, fs: f}, nil
}

// halted marks the process dead when the power was cut under it (at a
// disk call chosen by HaltAt): the machine is gone from that call on, and
// nothing it reports after is heard.
func (f procFS) halted() {
	if f.d.Halted() {
		f.p.dead.Store(true)
	}
}

// procFile is a file of procFS.
type procFile struct {
	filejournal.File
	fs procFS
}

func (f procFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.fs.halted()
	return n, err
}

func (f procFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.fs.halted()
	return n, err
}

func (f procFile) SyncData() error {
	err := f.File.SyncData()
	f.fs.halted()
	return err
}

func (f procFile) Truncate(size int64) error {
	err := f.File.Truncate(size)
	f.fs.halted()
	return err
}

func (f procFS) Stat(name string) (os.FileInfo, error) {
	if err := f.check("stat", name); err != nil {
		return nil, err
	}
	return f.d.Stat(name)
}

func (f procFS) SameFile(a, b os.FileInfo) bool { return f.d.SameFile(a, b) }

func (f procFS) Rename(oldpath, newpath string) error {
	if err := f.check("rename", oldpath); err != nil {
		return err
	}
	defer f.halted()
	return f.d.Rename(oldpath, newpath)
}

func (f procFS) Remove(name string) error {
	if err := f.check("remove", name); err != nil {
		return err
	}
	defer f.halted()
	return f.d.Remove(name)
}

func (f procFS) SyncDir(dir string) error {
	if err := f.check("sync", dir); err != nil {
		return err
	}
	defer f.halted()
	return f.d.SyncDir(dir)
}

func (f procFS) EvalSymlinks(name string) (string, error) {
	if err := f.check("lstat", name); err != nil {
		return "", err
	}
	return f.d.EvalSymlinks(name)
}

// simJournal is what the job's journals offer: the interface, and the
// optional methods a Client looks for (both filejournal.Journal and the
// fleet's worker have them).
type simJournal interface {
	idemhttp.Journal
	HighWater(ctx context.Context) (time.Time, error)
	Now(ctx context.Context) (time.Time, error)
	Retain(d time.Duration)
	// ClockDoubt: without it here, the Client never saw either journal's
	// doubt (a set-back nobody measured), and a fleet's Resume resent
	// entries of unknown age (bugFleetClock, seed 37729).
	ClockDoubt(ctx context.Context) (time.Time, error)
}

// recJournal is the journal as the client uses it, recording what it was
// told: every Begin acknowledged must survive a crash (unless its entry
// was deleted, or finished and then perhaps pruned), and the keys a call
// journaled are the call's (invariant 3).
//
// Every call into it takes its turn from the driver (world.turn): a step
// of its own, so that two calls woken at one virtual instant (two
// attempts' timeouts, say) never race on the disk or the database: which
// of two Finishes joins a batch first, or which disk call a power cut
// armed "at the disk's call n" lands on, is the seed's to say. The turn
// is taken before the call, with no lock of the journal held: a goroutine
// blocked on a mutex is not durably blocked, and the driver's
// synctest.Wait would never return. The log's one committer, which writes
// behind the calls, runs only when a call given its turn wakes it, or on
// its timer, while every call waits for a turn.
type recJournal struct {
	simJournal
	w *world
	p *clientProc
}

func (r *recJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	r.w.turn(ctx, r.p, "begin")
	if c, ok := ctx.Value(callKey{}).(*call); ok && !c.resume && !r.p.dead.Load() {
		c.attempted(e.Key)
		if e.Key != c.key {
			// As a job that logs the keys its journal's hook reports,
			// failed Begins' included (one may be in the journal after
			// all: a database's answer lost after its commit).
			r.w.mintedKey(c.op, e.Key)
		}
	}
	r.w.mu.Lock()
	if _, ok := r.w.begun[e.Key]; !ok {
		if r.w.begun == nil {
			r.w.begun = map[string]begin{}
		}
		r.w.clockSeq++
		r.w.begun[e.Key] = begin{at: time.Now(), seq: r.w.clockSeq, m: r.p.m}
	}
	r.w.mu.Unlock()
	read := r.p.m.readsClock() // the Client leaves Created for the journal to stamp
	existing, err := r.simJournal.Begin(ctx, e)
	read(err)
	if err == nil && existing == nil && !r.p.dead.Load() {
		r.w.acks.begun(e.Key, r.p.n)
	}
	return existing, err
}

// Get is the journal's Get, taken in turn: Resume rereads each entry
// with it before resending.
func (r *recJournal) Get(ctx context.Context, key string) (*idemhttp.Entry, error) {
	r.w.turn(ctx, r.p, "get")
	return r.simJournal.Get(ctx, key)
}

func (r *recJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	r.w.turn(ctx, r.p, "finish "+string(o.State))
	if o.State == idemhttp.StateDone {
		r.w.acks.finished(key)
	}
	read := r.p.m.readsClock() // and the outcome's time
	err := r.simJournal.Finish(ctx, key, o)
	read(err)
	r.fenced(ctx, err)
	return err
}

// Now is the journal's clock, by which the Client judges ages: a call
// that reads the clock (machine.readsClock). It takes no turn: it
// writes only when the clock jumped, and no seed's trace has a Now race
// a write.
func (r *recJournal) Now(ctx context.Context) (time.Time, error) {
	read := r.p.m.readsClock()
	t, err := r.simJournal.Now(ctx)
	read(err)
	return t, err
}

// ClockDoubt reads the clock too.
func (r *recJournal) ClockDoubt(ctx context.Context) (time.Time, error) {
	read := r.p.m.readsClock()
	t, err := r.simJournal.ClockDoubt(ctx)
	read(err)
	return t, err
}

func (r *recJournal) Delete(ctx context.Context, key string) error {
	r.w.turn(ctx, r.p, "delete")
	r.w.acks.deleted(key)
	err := r.simJournal.Delete(ctx, key)
	r.fenced(ctx, err)
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		c.mu.Lock()
		c.withdrew = append(c.withdrew, key) // tried: a withdrawal that failed may have happened all the same
		c.mu.Unlock()
	}
	return err
}

// fenced notes, for the known bugs' evidence, a write of the call's that
// the journal refused by fencing.
func (r *recJournal) fenced(ctx context.Context, err error) {
	if c, ok := ctx.Value(callKey{}).(*call); ok && errors.Is(err, idemhttp.ErrFenced) {
		c.mu.Lock()
		c.fenced = true
		c.mu.Unlock()
	}
}

func (r *recJournal) Prune(ctx context.Context, cutoff time.Time) (int, error) {
	r.w.turn(ctx, r.p, "prune")
	r.w.acks.pruning()
	return r.simJournal.Prune(ctx, cutoff)
}

func (r *recJournal) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	r.w.turn(ctx, r.p, "lookup")
	return r.simJournal.Lookup(ctx, operation)
}

func (r *recJournal) Pending(ctx context.Context) ([]*idemhttp.Entry, error) {
	r.w.turn(ctx, r.p, "pending")
	return r.simJournal.Pending(ctx)
}

// fleetRec is a fleet worker's recJournal as the Client sees it: a
// journal a fleet shares (it has ClaimPending), as contrib/postgres's.
type fleetRec struct{ *recJournal }

// ClaimPending is the worker's, taken in turn.
func (f fleetRec) ClaimPending(ctx context.Context, limit int) ([]*idemhttp.Entry, error) {
	return f.claim(ctx, limit)
}

// journal is the journal p's Clients are given: a fleet's worker's shows
// them that others share it.
func (p *clientProc) journal() idemhttp.Journal {
	if p.fj != nil {
		return fleetRec{p.rec}
	}
	return p.rec
}

// claim is the fleet worker's ClaimPending, taken in turn.
func (r *recJournal) claim(ctx context.Context, limit int) ([]*idemhttp.Entry, error) {
	r.w.turn(ctx, r.p, "claim")
	return r.p.fj.ClaimPending(ctx, limit)
}

var _ idemhttp.Journal = (*recJournal)(nil)

// Unwrap returns the journal r records the calls to, as a caller's
// wrapper does (see idemhttp.Journal): the Client finds through it the
// journal's declaration of its senders (filejournal's, one process's; the
// fleet worker's) and the optional methods r does not forward itself.
func (r *recJournal) Unwrap() idemhttp.Journal { return r.simJournal }

// acks is what the journals acknowledged, for invariant 5.
type acks struct {
	mu sync.Mutex
	// keys maps each acknowledged Begin's key to its state: live, or
	// finished (final, and prunable by the next Prune).
	keys map[string]ackState
}

type ackState int

const (
	ackLive     ackState = iota + 1
	ackFinished          // done: a Prune may drop it
	ackPrunable          // finished before a Prune started
)

func (a *acks) begun(key string, _ int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys[key] = ackLive
}

func (a *acks) finished(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.keys[key]; ok {
		a.keys[key] = ackFinished
	}
}

// deleted forgets key as soon as a Delete starts: whether it happens is
// the Delete's to say, and a crash may come before it answers.
func (a *acks) deleted(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.keys, key)
}

func (a *acks) pruning() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, s := range a.keys {
		if s == ackFinished {
			a.keys[k] = ackPrunable
		}
	}
}

// mustHave returns the keys an open of the journal must find, sorted.
func (a *acks) mustHave() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for k, s := range a.keys {
		if s != ackPrunable {
			out = append(out, k)
		}
	}
	sortStrings(out)
	return out
}

// The secrets every request carries, which must never reach the disk.
const (
	secretAuth     = "Bearer sk_live_simulated_AUTH_SECRET"
	secretCookie   = "session=simulated_COOKIE_SECRET"
	secretHeader   = "simulated_HEADER_SECRET"
	secretPrepared = "simulated_PREPARED_SECRET"
)

var secrets = []string{"AUTH_SECRET", "COOKIE_SECRET", "HEADER_SECRET", "PREPARED_SECRET", locationSecret}

// startClient starts a run of the client process on m: it opens the
// journal, checks it (invariants 5 to 7), and queues the batch; Resume
// (in a fleet, a claim of the pending entries no live lease holds, and
// their resend) runs first, or alongside, as the config says.
func (w *world) startClient(m *machine) *clientProc {
	w.cliN++
	p := &clientProc{w: w, m: m, n: w.cliN}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	m.cli = p
	w.tracef("client %d starts on %v", p.n, m)
	var j simJournal
	if w.fleet != nil {
		p.fj = &fleetJournal{FleetModelWorker: w.fleet.Worker(fmt.Sprintf("m%d", m.id)), w: w, p: p}
		j = p.fj
	} else {
		fj := w.openJournal(p)
		if fj == nil {
			return p
		}
		w.quietDisk.Store(true)
		if err := fj.Verify(context.Background()); err != nil {
			w.failKnown(invJournal, -1, w.cacheKnown(), "client %d: the journal does not verify: %v", p.n, err)
		}
		p.j, j = fj, fj
	}
	w.checkJournal(p)
	w.quietDisk.Store(false)
	p.rec = &recJournal{simJournal: j, w: w, p: p}
	for ci := range max(1, w.cfg.Clients) {
		// A connection pool per Client: two calls of one operation in
		// one process never share one (a response's connection
		// returned to the pool while the other call dials would make
		// which connection it gets a matter of scheduling), as each
		// operation has a host of its own. Two Clients would often
		// share one pool; the simulation cannot let them.
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return w.net.dial(ctx, p, ci, addr)
			},
			MaxIdleConnsPerHost: 2,
		}
		p.trs = append(p.trs, tr)
		var rt http.RoundTripper = tr
		switch w.cfg.Transport {
		case transportWrapped:
			rt = wrappedRT{rt: tr}
		case transportProtocol:
			outer := &http.Transport{}
			outer.RegisterProtocol(protocolScheme, protocolRT{rt: tr})
			rt = outer
		}
		p.hcs = append(p.hcs, &http.Client{Transport: rt, Timeout: attemptTimeout, CheckRedirect: checkRedirect(w.cfg.CheckRedirect)})
	}
	for _, hc := range p.hcs {
		pol := &idemhttp.Policy{
			MaxAttempts: w.cfg.MaxAttempts,
			// Delays of nanoseconds: a retry's jitter (math/rand's,
			// which no seed reaches) then never moves it past a
			// step of the driver, whose clock runs in milliseconds.
			BaseDelay:    2 * time.Nanosecond,
			MaxDelay:     16 * time.Nanosecond,
			KeepResults:  keepResults(w.cfg.KeepResults),
			RefetchDone:  w.cfg.RefetchDone,
			AllowUnnamed: !w.cfg.RequireOp,
			// The budget is per client and its order of withdrawals
			// is the order of timers within a step: kept out of reach.
			Budget: idemhttp.Budget{Capacity: 1 << 30},
		}
		if w.cfg.Backoff {
			pol.Backoff = func(retry int) time.Duration { return w.backoff(p, retry) }
		}
		if w.cfg.Pace > 0 {
			pol.Pacer = pacer{w: w}
		}
		if w.cfg.Classify > 0 {
			pol.Classify = w.classifier
		}
		p.cs = append(p.cs, &idemhttp.Client{
			HTTPClient:     hc,
			Policy:         pol,
			Journal:        p.journal(),
			SecretHeaders:  []string{"X-Sim-Secret"},
			PrepareRequest: w.prepare,
			Hooks:          w.hooks(p),
		})
	}
	p.queue = w.queueFor(p)
	if p.n > len(w.machines) || w.fleet != nil {
		w.startResume(p)
	} else {
		p.resumed = true
	}
	return p
}

func keepResults(on bool) int64 {
	if on {
		return 4 << 10
	}
	return 0
}

// attemptTimeout bounds each attempt (http.Client.Timeout): a request or
// response lost is noticed that much later.
const attemptTimeout = 10 * time.Second

// callKey finds a call in its requests' contexts.
type callKey struct{}

// call is one call of Client.Do, or Resume's whole run.
type call struct {
	id      int
	p       *clientProc
	op      int
	key     string // the key header it set
	resume  bool
	sdk     bool // through Client.StandardClient
	named   bool // WithOperation; else the client mints the key (and Resume alone protects it after a crash)
	client  int  // which of the process's Clients
	compact bool // not a call: a compaction of the journal

	mu       sync.Mutex
	keys     []string // keys its attempts carried
	zombie   bool     // it returned after its process died: nobody heard it
	done     bool     // it returned (world.finished; guarded by the world's mu): its outcome may be read
	turns    int      // its turns at the journal (see world.turn)
	notes    []stamped
	counts   map[string]int // callbacks reached, by name (world.callback)
	fenced   bool           // its withdrawal (Delete) was refused: another sender took the entry
	withdrew []string       // keys whose entries it withdrew (Delete)
	tries    int            // attempts it made (Hooks.OnAttempt)
	opened   bool           // it reached Hooks.OnCallStart: its key chosen, its entry written

	// Its outcome.
	class       outcome
	status      int
	body        []byte
	replayed    bool
	fromJournal bool
	err         error
	results     []idemhttp.ResumeResult // Resume's
	resumeErr   error
	claimed     int // in a fleet, the entries Resume was given
}

func (c *call) attempted(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.keys {
		if k == key {
			return
		}
	}
	c.keys = append(c.keys, key)
}

// outcome is what a call reported, as the batch job reads it.
type outcome int

const (
	outSuccess   outcome = iota + 1 // a 2xx response: fresh, replayed or the journal's copy
	outDone                         // *DoneError: the journal has the operation done
	outNotSent                      // ErrNotSent: nothing sent, no entry left; a new key may try again
	outExpired                      // ErrKeyExpired: past the retention, abandoned
	outClockJump                    // ErrClockJump: refused, the clock was set back
	outAmbiguous                    // any other error: the outcome is unknown, the entry pending
	outGone                         // Resume: the entry went while it was listed
	outStatus                       // a response that is neither 2xx nor 3xx
	outRedirect                     // a 3xx left unfollowed (by the client's rules or the caller's CheckRedirect), or the caller's CheckRedirect's refusal
	outPanic                        // a callback of the caller's panicked (the job recovered it)
	outNotKept                      // 410: the server ran it and kept no response to replay (a handler that committed its transaction itself)
)

var outcomeNames = [...]string{"", "success", "done", "not-sent", "expired", "clock-jump", "ambiguous", "gone", "status", "redirect", "panic", "not-kept"}

func (o outcome) String() string { return outcomeNames[o] }

// final reports whether o settles the operation for good, as far as the
// job is concerned: a redirect it chose not to follow is its answer.
func (o outcome) final() bool {
	return o == outSuccess || o == outDone || o == outExpired || o == outClockJump || o == outRedirect || o == outNotKept
}

func classify(err error) outcome {
	var done *idemhttp.DoneError
	switch {
	case err == nil:
		return outSuccess
	case errors.Is(err, idemhttp.ErrNotSent):
		return outNotSent
	case errors.As(err, &done):
		return outDone
	case errors.Is(err, idemhttp.ErrKeyExpired):
		return outExpired
	case errors.Is(err, idemhttp.ErrClockJump):
		return outClockJump
	case errors.Is(err, idemhttp.ErrNotFound):
		return outGone
	case errors.Is(err, errRedirectRefused):
		return outRedirect
	}
	return outAmbiguous
}

// classifyStatus is the class of a response the call got.
func classifyStatus(status int) outcome {
	switch status / 100 {
	case 2:
		return outSuccess
	case 3:
		return outRedirect
	}
	if status == http.StatusGone {
		return outNotKept
	}
	return outStatus
}

// request builds op's request as the batch job sends it: its
// credentials in the header and, for a named operation with SDKKey, a
// key header of the call's own (an SDK that mints one per call; the
// journal's key wins on a rerun).
func (w *world) request(ctx context.Context, c *call) *http.Request {
	op := c.op
	body, _ := json.Marshal(chargeRequest{Op: op, Amount: 100 + op})
	var rd io.Reader = bytes.NewReader(body)
	stream := w.draw(100, "stream", c.id) < w.cfg.Stream
	if stream {
		rd = struct{ io.Reader }{bytes.NewReader(body)} // no length, no GetBody from NewRequest
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s://op%d.sim%s", w.scheme(), op, modePaths[w.modes[op]]), rd)
	if err != nil {
		panic(err)
	}
	if stream {
		// A body streamed from elsewhere, which GetBody can produce
		// again (a file, a blob store).
		req.GetBody = w.getBody(c, body)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", secretAuth)
	req.Header.Set("Cookie", secretCookie)
	req.Header.Set("X-Sim-Secret", secretHeader)
	if t := w.tenantOf(op); t != "" {
		req.Header.Set(tenantHeader, t) // kept in the journal, for Resume: no secret
	}
	if c.key != "" {
		req.Header.Set("Idempotency-Key", c.key)
	}
	if w.cfg.AcceptGzip {
		req.Header.Set("Accept-Encoding", "gzip") // the job decodes what it reads (readAnswer)
	}
	return req
}

// startCall starts p's next listed operation.
func (w *world) startCall(p *clientProc) {
	op := p.queue[0]
	p.queue = p.queue[1:]
	p.busy++
	c := w.newCall(p, op, false)
	c.named = w.opNamed[op]
	c.client = w.draw(len(p.cs), "client", c.id)
	ctx := context.WithValue(p.ctx, callKey{}, c)
	if !bugRandKey {
		ctx = simkey.With(ctx, mintKey(c))
	}
	if c.named {
		if w.cfg.SDKKey {
			c.key = fmt.Sprintf("k-%d-%d", op, c.id)
		}
		ctx = idemhttp.WithOperation(ctx, opName(op))
	}
	c.sdk = w.rng.pick(w.cfg.SDK)
	w.tracef("call %d: op %d%s%s%s%s", c.id, op, keyText(c), map[bool]string{true: " through StandardClient"}[c.sdk],
		map[bool]string{true: fmt.Sprintf(" (client %d)", c.client)}[len(p.cs) > 1], streamText(w, c))
	req := w.request(ctx, c)
	cl := p.cs[c.client]
	go func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(simPanic); !ok {
					panic(r) // the client's own: a bug, loudly
				}
				c.class = outPanic
				c.err = fmt.Errorf("%v", r)
				w.finished(c)
			}
		}()
		do := cl.Do
		if c.sdk {
			do = cl.StandardClient().Do
		}
		resp, err := do(req)
		if err == nil {
			c.body, err = readAnswer(resp)
			_ = resp.Body.Close()
			c.status = resp.StatusCode
			c.replayed = idemhttp.Replayed(resp)
			if info, ok := idemhttp.ResponseInfo(resp); ok {
				c.fromJournal = info.FromJournal
				if info.Err != nil {
					// Through StandardClient, a give-up on a final
					// status comes back as that response; what the
					// client gave up with is in Info.Err.
					err = info.Err
				}
			}
		}
		c.err = err
		c.class = classify(err)
		if err == nil {
			c.class = classifyStatus(c.status)
		}
		w.finished(c)
	}()
}

func keyText(c *call) string {
	switch {
	case !c.named:
		return " unnamed"
	case c.key != "":
		return " key " + c.key
	}
	return ""
}

func streamText(w *world, c *call) string {
	if w.draw(100, "stream", c.id) < w.cfg.Stream {
		if w.draw(100, "bodychange", c.id) < w.cfg.BodyChange {
			return " streamed, its GetBody changed"
		}
		return " streamed"
	}
	return ""
}

// startCompact compacts p's journal (as an operator's tool would, or a
// Prune of many entries): a new file written beside the journal, synced,
// renamed over it, and its directory synced.
func (w *world) startCompact(p *clientProc) {
	c := w.newCall(p, -1, false)
	c.compact = true
	p.busy++
	w.tracef("call %d: compact the journal", c.id)
	go func() {
		c.err = p.j.Compact(p.ctx)
		w.finished(c)
	}()
}

// startResume runs Client.Resume for p, one entry at a time: of the
// whole journal, or, in a fleet, of the entries p's worker claims.
func (w *world) startResume(p *clientProc) {
	c := w.newCall(p, -1, true)
	p.resume = c
	w.tracef("call %d: resume%s", c.id, map[bool]string{true: " of the whole journal"}[p.fj != nil && w.scans(c)])
	ctx := context.WithValue(p.ctx, callKey{}, c)
	go func() {
		defer func() {
			// A callback's panic on one of Resume's goroutines goes on
			// in this one, Resume's caller's, once its resends stopped.
			if r := recover(); r != nil {
				if _, ok := r.(simPanic); !ok {
					panic(r) // the client's own: a bug, loudly
				}
				c.class = outPanic
				c.err = fmt.Errorf("%v", r)
				w.finished(c)
			}
		}()
		opts := &idemhttp.ResumeOptions{Concurrency: 1}
		if p.fj != nil && !w.scans(c) {
			es, err := p.rec.claim(ctx, 16)
			if err != nil {
				c.resumeErr = err
				w.finished(c)
				return
			}
			c.claimed = len(es)
			if len(es) == 0 {
				w.finished(c)
				return
			}
			opts.Entries = es
		}
		c.results, c.resumeErr = p.cs[0].Resume(ctx, opts)
		w.finished(c)
	}()
}

func opName(op int) string { return fmt.Sprintf("op-%d", op) }

func (w *world) newCall(p *clientProc, op int, resume bool) *call {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := &call{id: len(w.calls) + 1, p: p, op: op, resume: resume}
	w.calls = append(w.calls, c)
	return c
}

// finished records that c returned; the driver reads it at its next step.
func (w *world) finished(c *call) {
	zombie := c.p.dead.Load()
	w.mu.Lock()
	defer w.mu.Unlock()
	c.zombie = zombie
	c.done = true
	w.returned = append(w.returned, c)
}

// returnedCalls returns the calls that returned, whose outcomes may be
// read: a call of a dead process may still be running (a callback that
// blocks) as the run ends.
func (w *world) returnedCalls() []*call {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*call
	for _, c := range w.calls {
		if c.done {
			out = append(out, c)
		}
	}
	return out
}

// turn is where a call, about to begin its journal entry (or Resume,
// about to reread one), waits for the driver: a step of its own. Two
// calls of one operation in one process hand its sender's slot from one
// to the other; without this the one that wakes would go on at once,
// alongside the end of the one that finished (which returns its
// connection to the pool as its body is read), and whether it finds
// that connection idle would be a matter of scheduling.
func (w *world) turn(ctx context.Context, p *clientProc, what string) {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil || p.dead.Load() {
		return
	}
	t := &jturn{c: c, what: what, ch: make(chan struct{})}
	w.mu.Lock()
	c.turns++
	t.n = c.turns
	w.turns = append(w.turns, t)
	w.mu.Unlock()
	<-t.ch
}

// jturn is a call waiting for its turn at the journal.
type jturn struct {
	c    *call
	n    int // the call's turns so far
	what string
	ch   chan struct{}
}
