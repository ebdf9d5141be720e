//go:build go1.26

package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/servermodel"
	"github.com/idemkit/idemhttp/internal/simkey"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
	"github.com/idemkit/idemhttp/journaltest"
)

// world is one seed's run: the driver, and everything it drives. Only the
// driver goroutine (the bubble's main one) draws from rng, and it acts
// one step at a time: between two steps it waits until every other
// goroutine of the bubble is durably blocked (synctest.Wait), so that
// what one step set going (a delivered response: the client's retry
// logic, its journal write, the next dial) has run to its end before the
// next step, and virtual time moves only when the driver sleeps. The
// goroutines a step wakes are one causal chain; the few things that run
// on timers (a retry's backoff, an attempt's timeout, the journal's
// write-behind, a claim's renewal) end, for the client, at the network,
// which waits for the driver, and so does each call at the journal (see
// world.turn); what the client's goroutines decide for the world (a
// callback that panics) is drawn from a hash of the seed and the
// decision's name (world.draw), not from a stream. That is what makes a
// seed's run the same every time (TestSimSameSeedSameTrace, TestSim and
// TestSimDeterminism check it).
type world struct {
	cfg  Config
	seed uint64

	rng  *lrand // the driver's choices
	drng *lrand // the disk's and the database's faults and power cuts

	net      *network
	machines []*machine
	fleet    *journaltest.FleetModel // the fleet's journal; nil for one machine with a file journal
	dbOff    atomic.Int64            // the fleet database's clock: virtual time plus this
	ledger   *ledger                 // the business's database: what committed
	kv       *servermodel.Store      // the streamed world's store
	srvOff   atomic.Int64            // the store's (the database's) clock: virtual time plus this
	acks     *acks
	batch    []int           // the listed operations, in order, duplicates included
	modes    []int           // how the server answers each operation's URL (modePlain...)
	opNamed  []bool          // the job names the operation (WithOperation); else the client mints its key
	everDone map[string]bool // keys a scan of a journal found done (invariant 8)

	mu              sync.Mutex // what goroutines other than the driver touch
	calls           []*call
	returned        []*call
	gates           []*gate
	gateSeq         int
	turns           []*jturn      // calls waiting for their turn at the journal
	srvs            []*serverProc // the server processes up
	serverCrashes   int
	snotes          []stamped       // the store's lines of the step (flushStoreNotes)
	storeCalls      map[string]int  // calls of the store, by kind and key (storeFault)
	selfCommitted   map[string]bool // store keys whose handler committed its transaction itself
	hungN           map[string]int  // hung calls so far, by request, kind and key (hangWait)
	connReqs        map[string]int  // requests so far, by the server's connection
	commits         map[string]int  // the transactional shell's commits so far, by key
	stats           map[string]int
	outcomes        map[string]int // the calls' outcomes, by class (Result.Outcomes)
	trace           []string
	begun           map[string]begin // where and when each key was first Begun (onceLimit)
	dbJumps         []clockJump      // the fleet database's clock's jumps (onceLimit)
	clockSeq        int              // orders jumps and first Begins, which one virtual instant may hold both
	cacheOnly       bool             // a truncation failed (bugCacheOnly)
	panickedOpening bool             // a journal hook panicked as a call opened (bugPanicSlot)
	opKeys          map[int][]string // keys the client minted for each unnamed operation, as journaled
	keyOp           map[string]int   // the operation of each key a call journaled

	cliN, srvN      int
	partitions      int          // partitions of the store so far
	partUntil       atomic.Int64 // the store is cut off until then (UnixNano), 0 if never
	storeJumps      int          // jumps of the store's clock so far
	procJumps       int          // jumps of a server process's clock so far (server_clock.go)
	storeForward    bool         // the streamed store's clock jumped forward
	faulty          atomic.Bool
	quietDisk       atomic.Bool
	opening         atomic.Bool // a journal's open is under way (open.go)
	clientCrashes   int
	clockJumps      int
	serverDownSince time.Time
	t0              time.Time
	step            int
	steps           int // every settle, for the statistics
	requests        int
	final           []bool // the job got an answer that settles the operation (world.settled)

	failures []Failure
}

// Failure is an invariant a run broke.
type Failure struct {
	Inv   string // which: see the inv constants
	Op    int    // the operation, -1 if none
	Step  int
	Msg   string
	Known string // a bug of the client already found and not fixed yet that explains it (see KnownBugs), "" if none
	// Limit is the product's documented limit that explains it, "" if
	// none: a world in which nothing can keep the guarantee (see
	// onceLimit). It is no bug: the run passes, and counts it.
	Limit string
}

func (f Failure) String() string {
	s := fmt.Sprintf("invariant %q broken at step %d: %s", f.Inv, f.Step, f.Msg)
	if f.Known != "" {
		s += " [known bug: " + f.Known + "]"
	}
	if f.Limit != "" {
		s += " [documented limit: " + f.Limit + "]"
	}
	return s
}

// The invariants, as the issue numbers them (7 and 8 are issue 32's).
const (
	invOnce      = "1 at most one effect per operation"
	invSuccess   = "2 a success has exactly its effect"
	invNotSent   = "3 nothing reported not-sent ran"
	invLost      = "4 every operation resolved after recovery"
	invJournal   = "5 the journal opens, verifies and keeps every acknowledged Begin"
	invSecret    = "6 no secret in the journal's bytes"
	invDone      = "7 a done entry's effect exists"
	invDoneStay  = "8 done stays done across every crash and reopen"
	invStuck     = "liveness: the recovery ends"
	invUnwanted  = "an error the batch job cannot have caused"
	invLeak      = "every goroutine ends"
	invSameTrace = "same seed, same trace"
)

// Invariants lists the invariants every seed checks.
var Invariants = []string{invOnce, invSuccess, invNotSent, invLost, invJournal, invSecret, invDone, invDoneStay, invStuck, invUnwanted, invLeak}

// Result is what a seed's run reports.
type Result struct {
	Seed     uint64
	Config   Config
	Failures []Failure
	Trace    []string
	Hash     string         // of the trace: the same for two runs of a seed
	Faults   map[string]int // faults injected, by kind
	Outcomes map[string]int // what the calls returned, as the job read them, by class
	Steps    int            // the driver's steps, the recovery's included
	Requests int            // requests delivered to the server
	Procs    int            // client processes started
}

// lrand is a random source shared by goroutines that never draw at once
// (see world), locked all the same.
type lrand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newRand(seed uint64, stream uint64) *lrand {
	return &lrand{r: rand.New(rand.NewPCG(seed, stream))}
}

func (l *lrand) intn(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

// pick reports true pct percent of the time.
func (l *lrand) pick(pct int) bool { return pct > 0 && l.intn(100) < pct }

// permille reports true n tenths of a percent of the time.
func (l *lrand) permille(n int) bool { return n > 0 && l.intn(1000) < n }

// Run runs seed's world with cfg. It must be called inside a synctest
// bubble (synctest.Test): see RunSeed.
func Run(seed uint64, cfg Config) *Result { return newWorld(seed, cfg).runResult() }

// newWorld draws seed's world with cfg.
func newWorld(seed uint64, cfg Config) *world {
	simkey.Enable()
	w := &world{
		cfg:      cfg,
		seed:     seed,
		rng:      newRand(seed, 1),
		drng:     newRand(seed, 3),
		acks:     &acks{keys: map[string]ackState{}},
		stats:    map[string]int{},
		outcomes: map[string]int{},
		opKeys:   map[int][]string{},
		keyOp:    map[string]int{},
		everDone: map[string]bool{},
		final:    make([]bool, cfg.Ops),
	}
	w.storeCalls = map[string]int{}
	w.selfCommitted = map[string]bool{}
	w.hungN = map[string]int{}
	w.connReqs = map[string]int{}
	w.commits = map[string]int{}
	w.ledger = &ledger{db: &servermodel.DB{Now: w.storeClock, Wait: w.hangWait}}
	w.kv = &servermodel.Store{Now: w.storeClock, Faults: w.storeFault, Wait: w.hangWait}
	w.net = newNetwork(w)
	for op := range cfg.Ops {
		w.batch = append(w.batch, op)
		mode := modePlain
		if w.draw(100, "redirect", op) < cfg.Redirect {
			mode = 1 + w.draw(numModes-1, "mode", op)
		}
		w.modes = append(w.modes, mode)
		w.opNamed = append(w.opNamed, w.draw(100, "unnamed", op) >= cfg.Unnamed)
	}
	for i := range cfg.Dups {
		// A duplicate right after the operation it repeats: two
		// workers may then call it at once. (Not of an unnamed
		// operation: the job would run it twice, under two keys.)
		op := i % cfg.Ops
		if !w.opNamed[op] {
			continue
		}
		at := slices.Index(w.batch, op) + 1
		w.batch = slices.Insert(w.batch, at, op)
	}
	if cfg.Fleet >= 2 {
		w.fleet = journaltest.NewFleetModel(&journaltest.FleetModelOptions{Clock: w.dbClock, Lease: time.Duration(max(1, cfg.Lease)) * time.Second})
		for i := range cfg.Fleet {
			m := &machine{w: w, id: i + 1}
			for _, op := range w.batch {
				// Every machine calls every named operation, as each
				// machine of a fleet given one batch does; an unnamed
				// one is one machine's alone.
				if w.opNamed[op] || op%cfg.Fleet == i {
					m.ops = append(m.ops, op)
				}
			}
			w.machines = append(w.machines, m)
		}
	} else {
		m := &machine{w: w, id: 1, ops: w.batch}
		m.disk = simdisk.New(&simdisk.Options{Torn: simdisk.Torn(cfg.Torn), DirPrefix: cfg.DirKeep, NoDSync: cfg.NoDSync})
		m.disk.SetFault(w.diskFault)
		w.machines = append(w.machines, m)
	}
	return w
}

// runResult runs the world and says what it came to.
func (w *world) runResult() *Result {
	w.run()
	return w.result()
}

func (w *world) result() *Result {
	h := sha256.New()
	for _, l := range w.trace {
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	return &Result{Seed: w.seed, Config: w.cfg, Failures: w.failures, Trace: w.trace, Hash: hex.EncodeToString(h.Sum(nil)[:8]), Faults: w.stats,
		Outcomes: w.outcomes, Steps: w.steps, Requests: w.requests, Procs: w.cliN}
}

func (w *world) run() {
	w.t0 = time.Now()
	w.faulty.Store(true)
	for op, mode := range w.modes {
		if mode != modePlain || !w.opNamed[op] {
			w.tracef("op %d: %s%s", op, modeNames[mode], map[bool]string{false: ", unnamed"}[w.opNamed[op]])
		}
	}
	if sh := w.cfg.Shell; sh >= 0 && sh < numShells {
		w.tracef("the server: the %s shell, %d instance(s), %d tenant(s)", shellNames[sh], w.instances(), max(1, w.cfg.Tenants))
	}
	w.startServer()
	for _, m := range w.machines {
		w.startClient(m)
	}
	for w.step = 0; w.step < w.cfg.Steps && len(w.failures) == 0; w.step++ {
		w.settle()
		if !w.act() {
			break
		}
	}
	if len(w.failures) == 0 {
		w.recover()
	}
	if len(w.failures) == 0 {
		w.checkEnd()
	}
	w.tracef("end: state %s", w.diskDigest())
	w.teardown()
}

// diskDigest sums up what the disks and the fleet's database hold at
// the end of a run (every file's name and bytes, and how many changing
// calls each disk took; every entry), so that a run's hash covers what
// the trace does not show: two runs of a seed whose records reached a
// batch in another order, say, print the same lines but leave other
// bytes.
func (w *world) diskDigest() string {
	h := sha256.New()
	for _, m := range w.machines {
		if m.disk == nil {
			continue
		}
		for _, name := range m.disk.Names() {
			b, _ := m.disk.ReadFile(name)
			fmt.Fprintf(h, "%d %s %d\n", m.id, name, len(b))
			h.Write(b)
		}
		fmt.Fprintf(h, "mutations %d\n", m.disk.Mutations())
	}
	if w.fleet != nil {
		for _, e := range w.fleet.Entries() {
			fmt.Fprintf(h, "%s %s %s %v %v %d %d %s %x\n", e.Key, e.Operation, e.URL, e.Created.UnixNano(), e.Updated.UnixNano(), e.Attempts, e.LastStatus, e.State, e.Body)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// tracef adds a line to the trace, stamped with the virtual time.
func (w *world) tracef(format string, args ...any) { w.traceAt(time.Now(), format, args...) }

// traceAt adds a line to the trace, stamped with the virtual time at.
func (w *world) traceAt(at time.Time, format string, args ...any) {
	ms := strconv.FormatInt(at.Sub(w.t0).Milliseconds(), 10)
	line := strings.Repeat(" ", max(0, 9-len(ms))) + ms + " " + fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.trace = append(w.trace, line)
	w.mu.Unlock()
	if Live {
		fmt.Fprintln(os.Stderr, line)
	}
}

// Live, set by a test (-sim.live), prints each line of the trace as it
// is made: for a run that does not end.
var Live bool

func (w *world) count(kind string) {
	w.mu.Lock()
	w.stats[kind]++
	w.mu.Unlock()
}

// diskFailed counts and traces a fault of the disk.
func (w *world) diskFailed(kind string, op simdisk.Op) {
	w.count(kind)
	w.tracef("disk: %s (%s %s at %d, %d bytes)", kind, op.Kind, op.Path, op.Off, op.Len)
}

func (w *world) fail(inv string, op int, format string, args ...any) {
	w.failKnown(inv, op, "", format, args...)
}

// failKnown records a failure that the known bug known explains ("" if
// none does).
func (w *world) failKnown(inv string, op int, known string, format string, args ...any) {
	f := Failure{Inv: inv, Op: op, Step: w.step, Msg: fmt.Sprintf(format, args...), Known: known}
	w.tracef("FAIL %s", f)
	w.mu.Lock()
	w.failures = append(w.failures, f)
	w.mu.Unlock()
}

// seedBytes is a ChaCha8 seed for the stream n of the world's seed.
func (w *world) seedBytes(n uint64) [32]byte {
	var b [32]byte
	binary.LittleEndian.PutUint64(b[:], w.seed)
	binary.LittleEndian.PutUint64(b[8:], n)
	return b
}

func (w *world) serverCrashesLeft() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cfg.ServerCrashes - w.serverCrashes
}

// diskFault is the simulated disk's Fault: ENOSPC and EIO, as the seed
// says, while faults are on and the disk is not quiet (the checks' reads
// of a journal just opened; an open, unless Config.OpenFaults: see
// open.go).
func (w *world) diskFault(op simdisk.Op) error {
	if !w.faulty.Load() || w.quietDisk.Load() {
		return nil
	}
	if w.opening.Load() {
		return w.openFault(op)
	}
	switch op.Kind {
	case simdisk.OpWrite:
		if w.drng.permille(w.cfg.WriteErr) {
			if w.drng.intn(2) == 0 {
				w.diskFailed("disk ENOSPC on write", op)
				return syscall.ENOSPC
			}
			w.diskFailed("disk EIO on write", op)
			return syscall.EIO
		}
	case simdisk.OpSync:
		if w.drng.permille(w.cfg.SyncErr) {
			w.diskFailed("disk EIO on sync", op)
			return syscall.EIO
		}
	case simdisk.OpTruncate, simdisk.OpRename, simdisk.OpRemove, simdisk.OpSyncDir:
		if w.drng.permille(w.cfg.OtherErr) {
			if op.Kind == simdisk.OpTruncate {
				w.mu.Lock()
				w.cacheOnly = true
				w.mu.Unlock()
			}
			w.diskFailed("disk EIO on "+op.Kind.String(), op)
			return syscall.EIO
		}
	case simdisk.OpOpen:
		if op.Flag&0x40 != 0 && w.drng.permille(w.cfg.OtherErr) { // O_CREATE
			w.diskFailed("disk EIO on create", op)
			return syscall.EIO
		}
	}
	return nil
}

// settle waits for the bubble to come to rest, then reads what returned
// since the last step, in call order.
func (w *world) settle() {
	w.steps++
	synctest.Wait()

	for _, m := range w.machines {
		if p := m.cli; p != nil && m.disk != nil && m.disk.Halted() {
			// The power was cut at a disk call the seed chose
			// (HaltAt): the machine is down from that call on
			// (procFile marked the process dead there).
			w.powerCut(p, "at a disk call")
			synctest.Wait()
		}
	}
	w.flushNotes()
	w.flushStoreNotes()
	w.mu.Lock()
	ret := w.returned
	w.returned = nil
	w.mu.Unlock()
	sort.Slice(ret, func(i, j int) bool { return ret[i].id < ret[j].id })
	for _, c := range ret {
		w.collect(c)
	}
}

// collect reads a call that returned, as the batch job does.
func (w *world) collect(c *call) {
	p := c.p
	zombie := c.zombie
	switch {
	case c.resume && zombie:
	case c.resume:
		claimed := ""
		if p.fj != nil {
			claimed = fmt.Sprintf(" (claimed %d)", c.claimed)
		}
		w.tracef("call %d: resume%s: %d results, err %v", c.id, claimed, len(c.results), errText(c.resumeErr))
		for _, r := range c.results {
			op := w.opOfKey(r.Entry.Key)
			class := classify(r.Err)
			if r.Err == nil {
				class = classifyStatus(r.StatusCode)
			}
			w.tracef("  resent op %d key %s: %v %d %s%s", op, r.Entry.Key, class, r.StatusCode, errText(r.Err), replayText(r.Replayed))
			if class.final() && op >= 0 && op < len(w.final) {
				w.final[op] = true
			}
		}
	case c.compact:
		w.tracef("call %d: compact: %s", c.id, errText(c.err))
		if c.err != nil && !zombie {
			p.jerr.Store(true) // a journal whose compaction failed may have stopped writing
		}
	case zombie:
		// Unheard, and not traced: when a dead process's goroutine gets
		// around to returning is no part of the world.
	default:
		w.tracef("call %d: op %d: %v %d %s%s%s", c.id, c.op, c.class, c.status, errText(c.err), replayText(c.replayed), journalText(c.fromJournal))
		named := "named"
		if !c.named {
			named = "unnamed"
		}
		w.outcomes[c.class.String()+" ("+named+")"]++
		refused := !c.named && w.cfg.RequireOp && errors.Is(c.err, idemhttp.ErrInvalidRequest)
		switch {
		case refused:
			// The client refused an unnamed call (no AllowUnnamed), as it
			// must: the job names the operation from now on.
			if !errors.Is(c.err, idemhttp.ErrNotSent) {
				w.fail(invUnwanted, c.op, "call %d of op %d: refused for want of an operation id, yet not reported not-sent: %v", c.id, c.op, errText(c.err))
			}
			w.opNamed[c.op] = true
		case w.classifierCaused(c):
			// The caller's classifier returned the status, or declared
			// a mismatch: its doing (classifier.go).
		case c.class == outStatus:
			w.failKnown(invUnwanted, c.op, w.statusKnown(c.op, c.status), "call %d of op %d: status %d %v", c.id, c.op, c.status, errText(c.err))
		case c.class == outAmbiguous && unwanted(c.err):
			w.fail(invUnwanted, c.op, "call %d of op %d: %v", c.id, c.op, errText(c.err))
		}
		if c.class.final() || w.classifierCaused(c) {
			w.final[c.op] = true
		}
		if (refused || c.class == outNotSent && !c.named) && !p.exiting && !p.dead.Load() {
			// Nothing was sent, nothing is left in the journal: the
			// job tries the operation again, under a new key.
			p.queue = append(p.queue, c.op)
		}
	}
	if c.resume {
		if p.resume == c {
			p.resume = nil
		}
		p.resumed = true
	} else {
		p.busy--
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return "(" + s + ")"
}

func replayText(b bool) string {
	if b {
		return " replayed"
	}
	return ""
}

func journalText(b bool) string {
	if b {
		return " from-journal"
	}
	return ""
}

// opOfKey reads the operation back from a key the sim made ("k-<op>-...").
func (w *world) opOfKey(key string) int {
	w.mu.Lock()
	op, ok := w.keyOp[key]
	w.mu.Unlock()
	if ok {
		return op
	}
	parts := strings.SplitN(key, "-", 3)
	if len(parts) < 2 {
		return -1
	}
	op, err := strconv.Atoi(parts[1])
	if err != nil {
		return -1
	}
	return op
}

// action is one thing the driver may do next.
type action struct {
	weight int
	name   string
	do     func()
}

// act chooses and does the next step of the faulty phase; false when
// nothing is left to do.
func (w *world) act() bool {
	now := time.Now()
	var acts []action
	add := func(weight int, name string, do func()) {
		if weight > 0 {
			acts = append(acts, action{weight, name, do})
		}
	}
	for _, m := range w.net.readyMsgs(now) {
		add(10, "deliver", func() { w.onMessage(m) })
	}
	for _, d := range w.net.readyDials() {
		add(10, "dial", func() { w.onDial(d) })
	}
	busy := false
	var alive []*clientProc
	for _, m := range w.machines {
		p := m.alive()
		if p == nil {
			if !now.Before(m.downSince.Add(time.Second)) {
				add(10, "client restart", func() { w.startClient(m) })
			}
			continue
		}
		alive = append(alive, p)
		busy = busy || p.busy > 0 || p.resume != nil || len(p.queue) > 0
		if !p.exiting && len(p.queue) > 0 && p.busy < w.cfg.Workers && (p.resumed || w.cfg.Concurrent) {
			add(10, "call", func() { w.startCall(p) })
		}
		if !p.exiting && p.j != nil {
			add(w.cfg.Compact, "compact", func() { w.startCompact(p) })
		}
		if p.jerr.Load() && !p.exiting || p.exiting && p.busy == 0 && p.resume == nil {
			add(20, "exit", func() { w.exitClient(p) })
		}
	}
	w.mu.Lock()
	gates := slices.Clone(w.gates)
	w.mu.Unlock()
	for _, g := range gates {
		add(4, "release", func() { w.release(g) })
	}
	for _, t := range w.readyTurns() {
		add(10, "turn", func() { w.giveTurn(t) })
	}

	w.mu.Lock()
	downSince := w.serverDownSince
	w.mu.Unlock()
	if len(w.servers()) < w.instances() && !now.Before(downSince.Add(time.Second)) {
		add(10, "server restart", func() { w.startServer() })
	}
	ready := len(acts) > 0
	var crashable []*clientProc
	for _, p := range alive {
		if !p.m.haltArmed {
			crashable = append(crashable, p)
		}
	}
	crashClient := len(crashable) > 0 && w.clientCrashes < w.cfg.ClientCrashes
	crash := func() { w.crashClient(crashable[w.rng.intn(len(crashable))]) }
	srvs := w.crashable()
	crashServer := len(srvs) > 0 && w.serverCrashesLeft() > 0
	crashSrv := func() { w.crashServer(srvs[w.rng.intn(len(srvs))], "a step of the driver") }
	jump := w.clockJumps < w.cfg.ClockJumps
	partition := w.partitions < w.cfg.Partitions && w.partitionDue()
	storeJump := w.storeJumps < w.cfg.StoreJumps
	procJump := w.procJumpWeight()
	if !ready && !busy && w.net.nextDue(now).IsZero() {
		// Nothing in flight: the batch ran to its end. What is left is
		// a fault to throw at the next run, or the end of the phase.
		var idle []action
		if crashClient {
			idle = append(idle, action{1, "client crash", crash})
		}
		if crashServer {
			idle = append(idle, action{1, "server crash", crashSrv})
		}
		if jump {
			idle = append(idle, action{1, "clock jump", w.jumpClock})
		}
		if storeJump {
			idle = append(idle, action{1, "store clock jump", w.jumpStoreClock})
		}
		if procJump > 0 {
			idle = append(idle, action{1, "server clock jump", w.jumpProcClock})
		}
		if len(idle) == 0 || w.rng.intn(len(idle)+1) == 0 {
			return false
		}
		idle[w.rng.intn(len(idle))].do()
		return true
	}
	if crashClient {
		add(1, "client crash", crash)
	}
	if crashServer {
		add(1, "server crash", crashSrv)
	}
	if jump {
		add(1, "clock jump", w.jumpClock)
	}
	if partition {
		add(1, "partition", w.partition)
	}
	if storeJump {
		add(1, "store clock jump", w.jumpStoreClock)
	}
	if procJump > 0 {
		add(procJump, "server clock jump", w.jumpProcClock)
	}
	if idle := w.net.idleConns(); len(idle) > 0 {
		add(w.cfg.CloseIdle, "close idle", func() { w.closeIdle(idle[w.rng.intn(len(idle))]) })
	}
	if !ready {
		// Only timers can move the world (a backoff, an attempt's
		// timeout, a 409's wait, the journal's write-behind, a
		// callback that blocks): let time pass, more of it at once.
		add(12, "sleep", func() { w.sleepFor(time.Millisecond << (6 + w.rng.intn(7))) })
	} else {
		add(3, "sleep", w.sleep)
	}
	total := 0
	for _, a := range acts {
		total += a.weight
	}
	n := w.rng.intn(total)
	for _, a := range acts {
		if n < a.weight {
			a.do()
			return true
		}
		n -= a.weight
	}
	panic("unreachable")
}

// sleep lets virtual time pass: 1 ms to 2 s, a whole number of
// milliseconds (see world), or rarely a day and more, past every key's
// retention.
func (w *world) sleep() { w.sleepFor(time.Millisecond << w.rng.intn(12)) }

// sleepFor sleeps d, or rarely a day and more.
func (w *world) sleepFor(d time.Duration) {
	if w.cfg.LongSleep && w.rng.intn(50) == 0 {
		// No connection lives through a day of silence (TCP's
		// timeouts end it): nothing on its way is delivered a day late.
		d = 25 * time.Hour
		w.count("a day passes")
		w.tracef("a day passes: every connection times out")
		w.net.resetAll()
	}
	w.tracef("sleep %v", d)
	time.Sleep(d)
}

// onMessage delivers m, or does to it what the seed says.
func (w *world) onMessage(m *message) {
	c := m.conn
	c.mu.Lock()
	gone, resetNext, eofNext := c.serverGone, c.resetNext, c.eofNext
	c.mu.Unlock()
	cfg := &w.cfg
	r := w.rng
	switch {
	case m.kind == msgRequest && gone:
		w.tracef("%v: lost, the server is gone", m)
		w.net.drop(m)
	case m.kind == msgRequest && r.pick(cfg.DropReq):
		w.count("request lost")
		w.tracef("%v: lost", m)
		w.net.drop(m)
	case m.kind == msgRequest && r.pick(cfg.ResetBefore):
		w.count("reset before the server")
		w.tracef("%v: reset before the server", m)
		w.net.reset(c)
	case m.kind == msgRequest && c.reused() && r.pick(cfg.DeadPooled):
		if r.intn(2) == 0 {
			w.count("pooled connection dead")
			w.tracef("%v: the pooled connection was closed", m)
			w.net.eofInsteadOf(m)
			break
		}
		w.count("pooled connection dies after the server")
		w.tracef("%v: delivered, then the pooled connection closes", m)
		w.mark(c, func() { c.eofNext = true })
		w.net.deliver(m)
	case m.kind == msgRequest && r.pick(cfg.ResetAfter):
		w.count("reset after the server")
		w.tracef("%v: delivered, then reset", m)
		w.mark(c, func() { c.resetNext = true })
		w.net.deliver(m)
	case m.kind == msgResponse && resetNext:
		w.tracef("%v: reset instead", m)
		w.net.reset(c)
	case m.kind == msgResponse && eofNext:
		w.tracef("%v: closed instead", m)
		w.net.eofInsteadOf(m)
	case m.kind == msgResponse && r.pick(cfg.DropResp):
		w.count("response lost")
		w.tracef("%v: lost", m)
		w.net.drop(m)
	case !m.delayed && r.pick(cfg.Delay):
		d := time.Millisecond << r.intn(12)
		w.count("message delayed")
		w.tracef("%v: delayed %v", m, d)
		m.delayed = true
		w.net.delay(m, time.Now().Add(d))
	default:
		w.tracef("%v: delivered", m)
		w.net.deliver(m)
	}
}

func (w *world) mark(c *conn, f func()) {
	c.mu.Lock()
	f()
	c.mu.Unlock()
}

// onDial accepts or refuses d.
func (w *world) onDial(d *pendingDial) {
	srvs := w.servers()
	switch {
	case len(srvs) == 0:
		w.tracef("dial %v: refused, no server", d.id)
		w.net.resolve(d, 0)
	case w.faulty.Load() && w.rng.pick(w.cfg.Refuse):
		w.count("dial refused")
		w.tracef("dial %v: refused", d.id)
		w.net.resolve(d, 0)
	case len(srvs) == 1:
		w.tracef("dial %v: accepted", d.id)
		w.net.resolve(d, srvs[0].n)
	default:
		s := srvs[w.rng.intn(len(srvs))]
		w.tracef("dial %v: accepted by server %d", d.id, s.n)
		w.net.resolve(d, s.n)
	}
}

// readyTurns returns the calls waiting for their turn at the journal,
// by call; those of dead processes get theirs at once.
func (w *world) readyTurns() []*jturn {
	w.mu.Lock()
	var out []*jturn
	var dead []*jturn
	for _, t := range w.turns {
		if t.c.p.dead.Load() {
			dead = append(dead, t)
		} else {
			out = append(out, t)
		}
	}
	w.mu.Unlock()
	for _, t := range dead {
		w.giveTurn(t)
	}
	slices.SortFunc(out, func(a, b *jturn) int {
		if a.c.id != b.c.id {
			return a.c.id - b.c.id
		}
		return a.n - b.n
	})
	return out
}

// giveTurn lets a call go on to the journal.
func (w *world) giveTurn(t *jturn) {
	w.mu.Lock()
	w.turns = slices.DeleteFunc(w.turns, func(x *jturn) bool { return x == t })
	w.mu.Unlock()
	if !t.c.p.dead.Load() {
		w.tracef("call %d: journal %s", t.c.id, t.what)
	}
	close(t.ch)
}

// release lets a held handler go on.
func (w *world) release(g *gate) {
	w.mu.Lock()
	w.gates = slices.DeleteFunc(w.gates, func(x *gate) bool { return x == g })
	w.mu.Unlock()
	w.tracef("release handler of op %d key %s", g.op, g.key)
	g.open()
}

// closeIdle closes the server's side of an idle connection.
func (w *world) closeIdle(c *conn) {
	w.count("server closes an idle connection")
	w.tracef("%v: the server closes it", c.id)
	_ = c.serverEnd.Close()
}

// jumpClock sets a client machine's clock (or, in a fleet, the
// database's) forward (by up to more than a day, past the retention) or
// back (by up to three hours).
func (w *world) jumpClock() {
	w.clockJumps++
	var d time.Duration
	if w.rng.intn(2) == 0 {
		d = time.Duration(1+w.rng.intn(30)) * time.Hour
		w.count("clock forward")
	} else {
		d = -time.Duration(2+w.rng.intn(180)) * time.Minute
		w.count("clock back")
	}
	if i := w.rng.intn(len(w.machines) + 1); w.fleet != nil && i == len(w.machines) {
		w.mu.Lock()
		w.clockSeq++
		w.dbJumps = append(w.dbJumps, clockJump{at: time.Now(), seq: w.clockSeq, d: d})
		w.mu.Unlock()
		w.dbOff.Add(int64(d))
		w.tracef("the database's clock jumps %v", d)
	} else {
		m := w.machines[i%len(w.machines)]
		w.mu.Lock()
		w.clockSeq++
		m.jumps = append(m.jumps, clockJump{at: time.Now(), seq: w.clockSeq, d: d})
		w.mu.Unlock()
		if d < 0 {
			m.backs.Add(1)
		}
		m.clockOff.Add(int64(d))
		w.tracef("%v: client clock jumps %v", m, d)
	}
}

// crashClient kills client process p: at once (the process dies, the
// machine's cache stays), by a power cut now, or by a power cut at one of
// the next few calls into the disk. (A machine of a fleet has no disk:
// its process is killed.)
func (w *world) crashClient(p *clientProc) {
	w.clientCrashes++
	m := p.m
	switch k := w.rng.intn(3); {
	case k == 0 || m.disk == nil:
		w.count("client killed")
		w.tracef("client %d killed", p.n)
		w.die(p, func() {
			if m.disk != nil {
				m.disk.Kill()
			}
		})
	case k == 1:
		w.powerCut(p, "now")
	default:
		n := 1 + w.rng.intn(8)
		w.count("power cut armed")
		w.tracef("client %d: power cut at its disk call %d from now", p.n, n)
		m.disk.HaltAt(n)
		m.haltArmed = true
	}
}

// powerCut ends p's machine: the disk keeps what was synced and, as the
// seed says, a torn part of the rest.
func (w *world) powerCut(p *clientProc, when string) {
	w.count("client power cut")
	w.tracef("client %d: power cut %s", p.n, when)
	w.die(p, func() { p.m.disk.Crash(rand.New(rand.NewPCG(w.seed, uint64(0x70f0+w.clientCrashes)))) })
	if m := p.m; m.backs.Load() > m.kept.Load() {
		w.lostSetBack(m)
	}
	p.m.reboot()
}

// clockJump is a jump of a clock that ages entries (a client machine's,
// or the fleet database's): when (virtual time), by how much, and, for a
// machine's set-back, whether a power cut lost it before its journal
// kept it (lostSetBack).
type clockJump struct {
	at   time.Time
	seq  int // its place among the jumps and first Begins (world.clockSeq)
	d    time.Duration
	lost bool
}

// retention is how long the world's clients take the server to keep a
// key: Policy.Retention's default, which they keep.
const retention = 24 * time.Hour

// begin is where and when a key was first Begun: what onceLimit ages it
// from.
type begin struct {
	at  time.Time
	seq int // see clockJump
	m   *machine
}

// lostSetBack notes that a power cut ended m's boot after its clock was
// set back and before its journal kept the jump (no call that reads the
// clock returned since: see machine.readsClock): the set-backs after the
// last one kept are lost. Across the reboot nothing on the machine can
// tell how far the clock went back: once the clock has passed the
// journal's high-water mark again, entries Begun before those set-backs
// look younger than they are by that much, for good
// (docs/journal-format.md, "Not detected"). onceLimit reckons with it.
func (w *world) lostSetBack(m *machine) {
	w.count("clock set-back lost at a power cut")
	w.tracef("%v: its clock's set-back was not kept when the power went", m)
	kept := m.kept.Load()
	w.mu.Lock()
	n := int64(0)
	for i := range m.jumps {
		if m.jumps[i].d < 0 {
			if n++; n > kept {
				m.jumps[i].lost = true
			}
		}
	}
	w.mu.Unlock()
	m.kept.Store(m.backs.Load())
}

// onceLimit is the documented limit that explains an operation with
// more than one effect, "" if none does: a clock set back where nothing
// could see it, so that the key looked younger than the server's
// retention when the server had forgotten it. Every effect is under one
// key, and at each effect after the first, the key's age as its journal
// judged it (the time since its Begin, plus the clock's forward jumps
// since, which a journal follows, minus the set-backs since that nothing
// saw; those it measured cancel out) was within the retention. The
// set-backs nothing saw: on a client machine, those a power cut lost
// before its journal kept them (lostSetBack); in a fleet, the database's,
// provided the fleet journal never found one (its doubt, which covers
// every entry older than a set-back it saw, is below the key's entry:
// contrib/postgres's doc, "nobody looked while the clock was below the
// mark"). Effects under two keys are never explained: that is a rerun
// under a fresh key, which no clock excuses; nor is a resend the
// arithmetic does not account for.
func (w *world) onceLimit(op int) string {
	es := w.ledger.of(op)
	if len(es) < 2 {
		return ""
	}
	for _, e := range es {
		if e.key != es[0].key {
			return ""
		}
	}
	key := es[0].key
	var created time.Time // the key's entry's Created, in a fleet
	if w.fleet != nil {
		for _, e := range w.fleet.Entries() {
			if e.Key == key {
				created = e.Created
			}
		}
		if created.IsZero() || !w.fleet.Doubt().Before(created) {
			return ""
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.begun[key]
	if !ok {
		return ""
	}
	jumps := b.m.jumps
	if w.fleet != nil {
		jumps = w.dbJumps
	}
	for _, e := range es[1:] {
		var unseen, forward time.Duration
		for _, j := range jumps {
			// After the Begin (its created time has what came
			// before), and strictly before the effect (a jump at its
			// instant may have come after the resend's judgement: not
			// counting it never excuses more).
			if j.seq < b.seq || !j.at.Before(e.at) {
				continue
			}
			switch {
			case j.d > 0:
				forward += j.d
			case j.lost || w.fleet != nil:
				unseen -= j.d
			}
		}
		if unseen == 0 || e.at.Sub(b.at)+forward-unseen > retention+idemhttp.ClockTolerance {
			return ""
		}
	}
	if w.fleet != nil {
		return "the database's clock set back while nothing read it, then carried past the high-water mark: nothing tells that clock from a right one"
	}
	return "the clock set back, then a power cut before the journal kept the jump: across the reboot nothing tells that clock from a right one"
}

// failOnce reports an operation's effects that break inv (1 or 2),
// with the known bug or documented limit that explains them.
func (w *world) failOnce(inv string, op int, format string, args ...any) {
	known := w.onceKnown(op)
	var limit string
	if known == "" {
		limit = w.onceLimit(op)
	}
	f := Failure{Inv: inv, Op: op, Step: w.step, Msg: fmt.Sprintf(format, args...), Known: known, Limit: limit}
	w.tracef("FAIL %s", f)
	w.mu.Lock()
	w.failures = append(w.failures, f)
	w.mu.Unlock()
}

// die ends client process p: its files first (disk, which kills them:
// nothing the process does from here reaches the disk), then its
// sockets, its calls (which the simulation cannot stop: they fail from
// here on, and what they report is not heard) and its journal.
func (w *world) die(p *clientProc, disk func()) {
	if p.gone {
		return
	}
	p.gone = true
	p.dead.Store(true)
	m := p.m
	if m.disk != nil {
		m.disk.HaltAt(0)
	}
	m.haltArmed = false
	disk()
	if p.cancel != nil {
		// Before anything wakes the process's calls (their turns, their
		// sockets): each then finds its context ended and stops, rather
		// than going on to a retry's backoff or not as it happens to be
		// scheduled against the rest of this step.
		p.cancel()
	}
	w.readyTurns() // its calls waiting at the journal go on, to fail
	w.net.killProc(p.n)
	for _, tr := range p.trs {
		tr.CloseIdleConnections()
	}
	if p.j != nil {
		_ = p.j.Close()
	}
	m.downSince = time.Now()
}

// exitClient ends a client process whose journal failed, as a batch job
// exits on such an error: its journal closed (a failed journal writes no
// marker), then restarted.
func (w *world) exitClient(p *clientProc) {
	if !p.exiting {
		p.exiting = true
		w.tracef("client %d: the journal failed; the job stops starting calls", p.n)
		return
	}
	w.tracef("client %d exits", p.n)
	w.die(p, func() {})
}

// recover is the end of every seed: no more faults, the server up, and
// the batch job run again on every machine until every operation is
// resolved: a clean restart (Close, Open, Resume, the batch), up to a
// few times. In a fleet, each restart waits for the leases of the
// processes before it to end, as a worker's entries wait for another to
// claim them.
func (w *world) recover() {
	w.settle() // a power cut the last step caused
	w.tracef("recovery: faults off")
	w.faulty.Store(false)
	for _, m := range w.machines {
		if m.disk != nil {
			m.disk.HaltAt(0)
		}
	}
	w.openGates()
	for round := 0; len(w.failures) == 0; round++ {
		for len(w.servers()) < w.instances() {
			w.startServer()
		}
		for _, m := range w.machines {
			if m.alive() == nil {
				if w.startClient(m); len(w.failures) > 0 {
					return
				}
			}
		}
		w.drain()
		if len(w.failures) > 0 || round > 0 && w.resolved() || round == 4 {
			return // round 0 ends the faulty phase's run: one clean restart at least
		}
		for _, m := range w.machines {
			p := m.cli
			w.tracef("client %d closes", p.n)
			if p.j != nil {
				_ = p.j.Close() // an error of a write that failed earlier: the next open's checks say what it left
			}
			w.die(p, func() {})
		}
		if w.fleet != nil {
			// Until the leases end by the database's clock: one it set
			// back since they were taken lengthens them by the jump (a
			// delay the fleet journal documents, not a loss).
			wait := max(w.fleet.Lease(), w.fleet.LeasesLeft())
			if wait > w.fleet.Lease() {
				w.tracef("the leases end, in %v: the database's clock was set back since they were taken", wait.Round(time.Second))
			} else {
				w.tracef("the leases end")
			}
			time.Sleep(wait + time.Second)
		}
	}
}

// drain runs the world without faults until nothing is left in flight.
func (w *world) drain() {
	idle := 0 // steps in a row in which the driver only let time pass
	for i := 0; ; i++ {
		// Ten minutes of virtual time in which the recovery only waited
		// is stuck: nothing in the world waits that long (a callback
		// blocks 90 s at most, a lease lasts a minute).
		if i > 20000 || idle > 600 {
			w.failKnown(invStuck, -1, w.stuckKnown(), "the recovery made no progress in %d steps (the last %d only waited, a second each)", i, idle)
			return
		}
		w.settle()
		if len(w.failures) > 0 {
			return
		}
		now := time.Now()
		idle++
		if ms := w.net.readyMsgs(now); len(ms) > 0 {
			idle = 0
			w.tracef("%v: delivered", ms[0])
			w.net.deliver(ms[0])
			continue
		}
		if ds := w.net.readyDials(); len(ds) > 0 {
			idle = 0
			w.onDial(ds[0])
			continue
		}
		if ts := w.readyTurns(); len(ts) > 0 {
			idle = 0
			w.giveTurn(ts[0])
			continue
		}

		acted, busy := false, false
		for _, m := range w.machines {
			p := m.alive()
			if p == nil {
				continue
			}
			if p.jerr.Load() && !p.exiting {
				w.exitClient(p) // a journal that failed in the faulty phase
			}
			if p.exiting && p.busy == 0 && p.resume == nil {
				w.exitClient(p)
				w.startClient(m)
				acted = true
				break
			}
			if !p.exiting && len(p.queue) > 0 && p.busy < w.cfg.Workers && (p.resumed || w.cfg.Concurrent) {
				w.startCall(p)
				acted = true
				break
			}
			busy = busy || p.busy > 0 || p.resume != nil || len(p.queue) > 0
		}
		if acted {
			idle = 0
			continue
		}
		if !busy && w.net.nextDue(now).IsZero() {
			return
		}
		d := time.Second
		if due := w.net.nextDue(now); !due.IsZero() && due.Sub(now) < d {
			d = due.Sub(now)
		}
		time.Sleep(d)
	}
}

// openGates lets every held handler go on.
func (w *world) openGates() {
	w.mu.Lock()
	gates := w.gates
	w.gates = nil
	w.mu.Unlock()
	for _, g := range gates {
		g.open()
	}
}

// teardown ends every goroutine of the world, so that the bubble can end.
func (w *world) teardown() {
	w.faulty.Store(false)
	for _, m := range w.machines {
		if m.disk != nil {
			m.disk.HaltAt(0)
		}
	}
	w.openGates()
	for _, m := range w.machines {
		if p := m.cli; p != nil {
			w.die(p, func() {})
		}
	}
	w.net.killAll()
	for _, s := range w.servers() {
		s.dead.Store(true)
		_ = s.srv.Close()
		<-s.done
	}
	// Calls of dead processes may be waiting out a backoff, an attempt's
	// timeout or a callback that blocks: time goes on until every
	// goroutine has ended (the longest wait is under two minutes).
	time.Sleep(2 * time.Minute)
	synctest.Wait()
}

// RunSeed runs seed's world with cfg in a synctest bubble of its own
// (synctest.Test), as a subtest of t that does not fail t: the result
// says what broke.
func RunSeed(t *testing.T, seed uint64, cfg Config) (res *Result) {
	var w *world
	defer func() {
		if r := recover(); r != nil {
			// A goroutine of the world that never ends (synctest's
			// "deadlock"): a leak, in the world or in the code it runs.
			// (The world's goroutines are done with by then.)
			f := Failure{Inv: invLeak, Op: -1, Msg: fmt.Sprint(r)}
			if w == nil {
				res = &Result{Seed: seed, Config: cfg, Failures: []Failure{f}}
				return
			}
			f.Known = w.stuckKnown()
			w.failures = append(w.failures, f)
			res = w.result()
		}
	}()
	synctest.Test(t, func(*testing.T) {
		w = newWorld(seed, cfg)
		res = w.runResult()
	})
	return res
}
