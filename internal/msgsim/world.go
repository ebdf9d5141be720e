//go:build go1.26

package msgsim

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/plant"
)

// The invariants every seed checks (docs/simulation.md, the consumers'
// section).
const (
	invOnce     = "1 every message's effect at most once"
	invLost     = "2 nothing lost: every message's effect, or its dead letter"
	invBoth     = "3 never both an effect and a dead letter"
	invAcked    = "4 nothing acked without its effect"
	invBudget   = "5 no dead letter before the failed runs the policy allows"
	invCounted  = "6 only failed runs counted: never a shutdown's requeue, a success or a run that never began"
	invForgot   = "7 a message's ledger record forgotten only once it is settled: its effect committed, or its dead letter known to have landed"
	invNoID     = "8 a message without an id never runs and is never acked: it is dead-lettered (Policy.NoID's default)"
	invRedrive  = "9 a redriven message runs again: its effect once, or a dead letter after runs that failed; never the tombstone its redrive cleared"
	invPrune    = "10 a prune at the age the docs require deletes no row of a message the broker may still deliver"
	invBeat     = "11 a delivery whose handler runs stays with its consumer: its beats renew the ack wait"
	invLive     = "liveness: every message settled once the faults stop"
	invCore     = "the core refused no move"
	invSQL      = "every statement modelled"
	invLeak     = "every goroutine ends"
	invSameSeed = "same seed, same trace"
)

// Invariants lists the invariants every seed checks.
var Invariants = []string{invOnce, invLost, invBoth, invAcked, invBudget, invCounted, invForgot, invNoID, invRedrive, invPrune, invBeat, invLive, invCore, invSQL, invLeak}

// Failure is an invariant a run broke.
type Failure struct {
	Inv   string
	Msg   string // the message id it is about, "" for none
	Step  int
	Text  string
	Known string // a limit of the design it is explained by (see Known), "" for none
}

func (f Failure) String() string {
	s := fmt.Sprintf("invariant %q broken at step %d: %s", f.Inv, f.Step, f.Text)
	if f.Known != "" {
		s += " [known: " + f.Known + "]"
	}
	return s
}

// Known lists the known limits of the design that explain some
// failures: counted and reported, not failed (docs/simulation.md, the
// consumers' section). None now: the two it had (a dead letter decided
// while a run of the message live elsewhere committed its effect, and a
// Kafka zombie's dead letter that the new owner ran again) are fixed by
// the dead letter's tombstone (inbox.OpTombstone), which conflicts with
// the effect's transaction.
var Known []string

// Result is what a seed's run reports.
type Result struct {
	Seed     uint64
	Config   Config
	Failures []Failure
	Trace    []string
	Hash     string         // of the trace and the database's and broker's end state: the same for two runs of a seed
	Stats    map[string]int // faults injected and what the consumers did, by kind
	Steps    int
}

// behaviour is how a message's handler behaves.
type behaviour uint8

const (
	healthy behaviour = iota
	poison
	flaky
	killer
	hanger
	slow
)

var behaviourNames = [...]string{"healthy", "poison", "flaky", "killer", "hanger", "slow"}

func (b behaviour) String() string { return behaviourNames[b] }

// outcome is how a handler run really ended, as the world saw it (not as
// the core decided): the oracle of the budget and of what may be
// counted.
type outcome uint8

const (
	outNone     outcome = iota // not ended (or never run)
	outOK                      // its effect committed, or it was a duplicate
	outFailed                  // returned an error of its own
	outLimit                   // passed the processing limit
	outShutdown                // ended by its consumer's shutdown
	outDied                    // its process died while it ran
	outBuried                  // its effect's transaction met the message's tombstone: nothing ran
)

var outcomeNames = [...]string{"none", "ok", "failed", "limit", "shutdown", "died", "buried"}

func (o outcome) String() string { return outcomeNames[o] }

// real reports whether o is a real failure of the handler's run.
func (o outcome) real() bool { return o == outFailed || o == outLimit || o == outDied }

// runRec is one delivery's run through the message core, for the oracle.
type runRec struct {
	id      string // process#n
	seq     int    // the world's count of runs when it began
	tag     int    // its queue delivery's tag (0 for Kafka's)
	msg     string
	epoch   int  // the ledger's epoch of msg when it began (see world.epoch)
	begun   bool // its OpBegin applied, and no OpFailBegun or OpExcuse since
	markAt  int  // the epoch its OpBegin applied in
	counted bool // its OpFail or OpFailBegun applied
	countAt int  // the epoch that applied in
	live    bool // its handler runs
	ran     bool // its handler ran
	started time.Time
	out     outcome
	snap    bool // budget holds the evidence of its last ledger answer
	budget  int  // the budget (see world.budget) when its last OpBegin, OpFail or OpFailBegun applied
}

// world is one seed's run. The driver (the bubble's main goroutine)
// draws every choice from rng and takes one step at a time: it lets one
// waiting turn go (a statement, a commit, a consumer's call to its
// broker), injects a fault, or lets virtual time pass; between two steps
// it waits until every goroutine of the bubble is durably blocked
// (synctest.Wait), so that what one step set going has run to its next
// turn. Every touch of shared state (the database, the broker, the
// trace) is made in a turn or by the driver: same seed, same run.
type world struct {
	cfg  Config
	seed uint64
	rng  *rand.Rand // the driver's choices
	drng *rand.Rand // the database's faults, drawn in turns

	mu        sync.Mutex // the database, the broker, the turns, the processes and runs
	db        *database
	q         *queue
	t         *topic
	behaviour map[string]behaviour
	dup       map[string]bool // published twice
	ids       []string
	slots     []*proc // each consumer's current process
	gens      []int
	pending   map[string]*turnReq
	runs      []*runRec
	epoch     map[string]int // per message: the applied OpForgets so far
	handled   map[string]int // per message: handler runs so far
	acked     map[string]int
	dead      map[string]int
	dlOK      map[string]bool // a dead letter of the message landed, and the shell was told so
	crashes   int
	faulty    bool

	// The operator's redrives (Config.Redrive).
	operator  *proc          // its process (its database pool), made at the first redrive
	operating bool           // a redrive is under way
	tombs     map[string]int // per message: tombstones committed so far
	redriven  map[string]*redriveRec

	// The pruner (Config.Prune).
	pruner  *proc       // its process (its database pool), made at the first prune
	pruning bool        // a prune is under way
	prunes  int         // prunes so far
	late    bool        // the producer's late duplicates (Config.LateDups) are still to come
	tearing atomic.Bool // the teardown: nothing more is traced (its processes end at once, in any order)
	t0      time.Time
	step    atomic.Int64

	tmu      sync.Mutex // the trace, the failures and the statistics
	trace    []string
	failures []Failure
	stats    map[string]int
}

// redriveRec is the last redrive of a message (Config.Redrive).
type redriveRec struct {
	tombs     int  // w.tombs when its tombstone was cleared (or, when it cleared none, when the redrive began)
	seq       int  // the runs begun before it was published again
	published bool // published again: its runs from now on are the redrive's
	deadAfter int  // dead letters of runs begun after it was published
}

// turnReq is a goroutine waiting for its turn.
type turnReq struct {
	key string
	p   *proc
	ch  chan struct{}
}

// proc is one consumer process: its broker connection, its database
// pool, its Runner; killed, it loses everything in memory.
type proc struct {
	w      *world
	slot   int
	name   string
	ctx    context.Context
	cancel context.CancelFunc
	killed chan struct{}
	dead   atomic.Bool
	exited bool // under w.mu
	db     *sql.DB
	runner *inbox.Runner
	in     *inbox.SQL
	handle inbox.Handler
	n      int // deliveries so far (the main goroutine's)

	mu     sync.Mutex
	held   []qdel
	parked []parkedDel // failed deliveries held for their delay (Config.Hold)

	kparts map[int]*kstate // Kafka: the partitions it owns, under w.mu
}

func (p *proc) isDead() bool { return p.dead.Load() }

// parkedDel is a failed delivery a process holds, unacknowledged, until
// its retry delay has passed (contrib/rabbitmq's hold).
type parkedDel struct {
	d   qdel
	r   *runRec
	dec inbox.Decision
}

type ctxKey int

const (
	runKey ctxKey = iota
	kindKey
	nKey
)

func runFrom(ctx context.Context) *runRec {
	if ctx == nil {
		return nil
	}
	r, _ := ctx.Value(runKey).(*runRec)
	return r
}

func kindFrom(ctx context.Context) string {
	if k, ok := ctx.Value(kindKey).(string); ok {
		return k
	}
	return "run"
}

// newWorld draws seed's world with cfg.
func newWorld(seed uint64, cfg Config) *world {
	w := &world{
		cfg:       cfg,
		seed:      seed,
		rng:       rand.New(rand.NewPCG(seed, 1)),
		drng:      rand.New(rand.NewPCG(seed, 2)),
		db:        newDatabase(),
		q:         newQueue(),
		behaviour: map[string]behaviour{}, dup: map[string]bool{}, pending: map[string]*turnReq{},
		epoch: map[string]int{}, handled: map[string]int{}, acked: map[string]int{}, dead: map[string]int{},
		dlOK: map[string]bool{}, tombs: map[string]int{}, redriven: map[string]*redriveRec{},
		stats: map[string]int{},
	}
	br := rand.New(rand.NewPCG(seed, 3))
	for i := range cfg.Messages {
		id := fmt.Sprintf("m%02d", i)
		b := healthy
		switch r := br.IntN(100); {
		case r < cfg.Poison:
			b = poison
		case r < cfg.Poison+cfg.Flaky:
			b = flaky
		case r < cfg.Poison+cfg.Flaky+cfg.Killer:
			b = killer
		case r < cfg.Poison+cfg.Flaky+cfg.Killer+cfg.Hanger:
			b = hanger
		case r < cfg.Poison+cfg.Flaky+cfg.Killer+cfg.Hanger+cfg.Slow:
			b = slow
		}
		w.behaviour[id] = b
		w.ids = append(w.ids, id)
	}
	for i := range min(cfg.Dups, cfg.Messages) {
		w.dup[w.ids[br.IntN(len(w.ids))]] = true
		_ = i
	}
	// Config.Spaces: the second queue's messages, each with the id of one
	// of the first's; Config.NoIDs: messages without an id (they never
	// run: healthy).
	for i := range min(cfg.Spaces, cfg.Messages) {
		id := spaceB + ":" + w.ids[i]
		w.behaviour[id] = w.behaviour[w.ids[br.IntN(cfg.Messages)]]
		w.ids = append(w.ids, id)
	}
	for i := range cfg.NoIDs {
		id := fmt.Sprintf("n%02d", i)
		w.behaviour[id] = healthy
		w.ids = append(w.ids, id)
	}
	return w
}

// spaceB is the id space of the second queue's messages (Config.Spaces).
const spaceB = "b"

// The world names each message by a key of its own: its id ("m03"), its
// id space and id ("b:m03", Config.Spaces), or "n00" for a message
// without an id (Config.NoIDs). msgOf splits a key into what the broker
// carries.
func msgOf(key string) (space, id string) {
	switch {
	case strings.HasPrefix(key, spaceB+":"):
		return spaceB, key[len(spaceB)+1:]
	case strings.HasPrefix(key, "n"):
		return "", ""
	}
	return "", key
}

// keyOf is the world's key of the message m.
func keyOf(m *inbox.Message) string {
	if m.IDSpace != "" {
		return m.IDSpace + ":" + m.ID
	}
	return m.ID
}

// rowOf is the inbox's and the ledger's row of the message key.
func rowOf(key string) rowKey {
	space, id := msgOf(key)
	c, _ := inbox.StoredConsumer("group", space)
	return rowKey{c, id}
}

// keyOfRow is the world's key of the message of the ledger's row k.
func keyOfRow(k rowKey) string {
	if space, ok := strings.CutPrefix(k.consumer, "group\x1f"); ok {
		return space + ":" + k.id
	}
	return k.id
}

func (w *world) now() time.Time { return time.Now() }

// logf adds a line to the trace. It is called by the driver or in a
// turn, never by two goroutines at once between two steps.
func (w *world) logf(format string, args ...any) {
	if w.tearing.Load() {
		return
	}
	line := fmt.Sprintf("%4d %8.3fs ", w.step.Load(), time.Since(w.t0).Seconds()) + fmt.Sprintf(format, args...)
	w.tmu.Lock()
	w.trace = append(w.trace, line)
	w.tmu.Unlock()
	if Live {
		fmt.Println(line)
	}
}

// debugTurns logs the turns waiting at each step.
var debugTurns = false

// Live prints each line of a trace as it is made (for a run that does
// not end).
var Live bool

func (w *world) failf(inv, msg, format string, args ...any) {
	f := Failure{Inv: inv, Msg: msg, Step: int(w.step.Load()), Text: fmt.Sprintf(format, args...)}
	w.tmu.Lock()
	w.failures = append(w.failures, f)
	w.tmu.Unlock()
	w.logf("FAIL %s", f)
}

func (w *world) failLocked(inv, msg, format string, args ...any) { w.failf(inv, msg, format, args...) }

func (w *world) stat(k string) {
	w.tmu.Lock()
	w.stats[k]++
	w.tmu.Unlock()
}

// turn waits until the driver lets the caller go: one statement, commit
// or call to the broker of p's, for run r (nil: the process's own), of
// kind. It fails when ctx ends first or p dies.
func (w *world) turn(ctx context.Context, p *proc, r *runRec, kind string) error {
	if p.isDead() {
		return errProcDead
	}
	key := p.name + "/" + kind
	if r != nil {
		key = r.id + "/" + kind
	}
	t := &turnReq{key: key, p: p, ch: make(chan struct{})}
	w.mu.Lock()
	if w.pending[key] != nil {
		w.mu.Unlock()
		w.failf(invSQL, "", "two turns at once named %s (a bug of the simulator)", key)
		return errors.New("msgsim: ambiguous turn")
	}
	w.pending[key] = t
	w.mu.Unlock()
	done := ctx.Done()
	withdraw := func() {
		w.mu.Lock()
		if w.pending[key] == t {
			delete(w.pending, key)
		}
		w.mu.Unlock()
	}
	select {
	case <-t.ch:
		if p.isDead() {
			return errProcDead
		}
		return nil
	case <-done:
		withdraw()
		return ctx.Err()
	case <-p.killed:
		withdraw()
		return errProcDead
	}
}

// eligible returns the keys of the turns worth granting now, sorted: a
// fetch only when the broker has something for it.
func (w *world) eligible() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	keys := make([]string, 0, len(w.pending))
	for k, t := range w.pending {
		if strings.HasSuffix(k, "/fetch") && !w.tearing.Load() && !w.canFetch(t.p) {
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (w *world) canFetch(p *proc) bool {
	if w.cfg.Kafka {
		return w.t.ready(p, w.now())
	}
	return w.q.ready(p, w.cfg.Prefetch, w.now()) || w.q.dueParked(p, w.now())
}

func (w *world) grant(key string) {
	w.mu.Lock()
	t := w.pending[key]
	delete(w.pending, key)
	w.mu.Unlock()
	if t != nil {
		close(t.ch)
	}
}

// start starts a process for consumer slot.
func (w *world) start(slot int) *proc {
	w.gens[slot]++
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{w: w, slot: slot, name: fmt.Sprintf("c%d.%d", slot+1, w.gens[slot]), ctx: ctx, cancel: cancel,
		killed: make(chan struct{}), kparts: map[int]*kstate{}}
	p.db = openDB(p)
	in := &inbox.SQL{DB: p.db}
	p.in = in
	p.handle = in.Handle("group", p.effect)
	lim := time.Duration(w.cfg.Limit) * time.Second
	p.runner = &inbox.Runner{
		Policy:  inbox.Policy{Retry: inbox.Retry{Delay: time.Second, MaxDelay: 8 * time.Second, MaxDeliveries: w.cfg.MaxDeliveries}},
		Ledger:  ledger{l: in.Ledger("group")},
		Handler: p.handler,
		Limit:   lim,
	}
	if w.cfg.AckWait > 0 {
		// A beat every third of the ack wait (off any other timer's
		// instant by its nanoseconds).
		p.runner.Every = ackBeat(w.cfg.AckWait)
	}
	if w.cfg.Kafka {
		// Kafka's adapter: no release at the limit (a partition's record
		// cannot go to another member): the limit is the handler's own,
		// a failure like any other.
		p.runner.Limit = 0
	}
	w.mu.Lock()
	w.slots[slot] = p
	if w.cfg.Kafka {
		w.assign()
	}
	w.mu.Unlock()
	w.logf("%s starts", p.name)
	go p.loop()
	return p
}

// ledger is the Runner's ledger: inbox.SQLLedger, whose statements take
// turns of their own kind.
type ledger struct{ l *inbox.SQLLedger }

func (l ledger) Apply(ctx context.Context, k inbox.Key, op inbox.Op) (inbox.Record, error) {
	return l.l.Apply(context.WithValue(ctx, kindKey, "ledger"), k, op)
}

var (
	errPoison = errors.New("msgsim: the handler cannot process this message")
	errFlaky  = errors.New("msgsim: the handler failed this time")
	errKilled = errors.New("msgsim: the handler killed its process")
)

// handler is the Runner's handler: inbox.SQL's Handle around effect, and
// the oracle's record of how the run really ended.
func (p *proc) handler(ctx context.Context, m *inbox.Message) error {
	w := p.w
	r := runFrom(ctx)
	lim := time.Duration(w.cfg.Limit) * time.Second
	w.mu.Lock()
	r.live, r.ran, r.started = true, true, w.now()
	w.handled[keyOf(m)]++
	n := w.handled[keyOf(m)]
	if m.ID == "" {
		w.failLocked(invNoID, r.msg, "%s, without an id, runs (%s)", r.msg, r.id)
	}
	w.mu.Unlock()
	hctx := context.WithValue(ctx, nKey, n)
	if w.cfg.Kafka {
		// The Kafka adapter's callHandler: the processing limit is the
		// handler's context's.
		var cancel context.CancelFunc
		hctx, cancel = context.WithTimeout(hctx, lim)
		defer cancel()
	}
	err := p.handle(hctx, m)
	if err != nil && hctx.Err() != nil {
		// Returned because its context ended, at the instant the
		// Runner's supervisor sees the limit: let the supervisor go
		// first, as it always may, so that the run is the same each
		// time.
		time.Sleep(time.Millisecond)
	}
	w.mu.Lock()
	r.live = false
	if r.out == outNone {
		switch {
		case w.now().Sub(r.started) >= lim:
			// Past its processing limit (whatever it returned then: a
			// commit in flight at the limit may still succeed), during
			// a shutdown too: the core may count it.
			r.out = outLimit
		case err == nil:
			r.out = outOK
		case errors.Is(err, inbox.ErrDeadLettered):
			r.out = outBuried
		case p.ctx.Err() != nil:
			r.out = outShutdown
		default:
			r.out = outFailed
		}
	}
	w.mu.Unlock()
	return err
}

// effect is the business handler, in the inbox's transaction.
func (p *proc) effect(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
	w := p.w
	r := runFrom(ctx)
	n, _ := ctx.Value(nKey).(int)
	key := keyOf(m)
	b := w.behaviour[key]
	if b == killer {
		if err := w.turn(ctx, p, r, "kill"); err != nil {
			return err
		}
		w.crash(p, "killed by "+key)
		return errKilled
	}
	if _, err := tx.ExecContext(ctx, effectSQL, key); err != nil {
		return err
	}
	lim := time.Duration(w.cfg.Limit) * time.Second
	var d time.Duration
	switch b {
	case poison:
		return errPoison
	case flaky:
		if n <= 2 {
			return errFlaky
		}
	case hanger:
		// Past the limit, ignoring its context; its transaction is
		// rolled back meanwhile, and its commit then fails.
		time.Sleep(lim + w.dur(r.id, "hang", lim))
		return nil
	case slow:
		d = w.dur(r.id, "slow", lim/2)
	default:
		d = w.dur(r.id, "healthy", time.Second)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	return nil
}

// dur draws a duration under max for what of the run id, from a hash of
// the seed (not a stream: the goroutine drawing it may run beside
// another), with a nanosecond part that keeps it off any other timer's
// instant.
func (w *world) dur(id, what string, max time.Duration) time.Duration {
	h := sha256.Sum256([]byte(strconv.FormatUint(w.seed, 10) + "/" + id + "/" + what))
	v := binary.LittleEndian.Uint64(h[:8])
	return time.Duration(v%uint64(max)) + time.Duration(v>>40%999983) + 1
}

// loop is a consumer process's main goroutine: take deliveries, run each
// through the Runner, map its decision onto the broker; at a shutdown,
// hand back what it holds through the core.
func (p *proc) loop() {
	defer p.exit()
	if p.w.cfg.Kafka {
		p.kafkaLoop()
		return
	}
	w := p.w
	for !p.isDead() {
		if p.ctx.Err() != nil {
			p.handBack()
			return
		}
		p.mu.Lock()
		empty := len(p.held) == 0
		p.mu.Unlock()
		if empty {
			if err := w.turn(p.ctx, p, nil, "fetch"); err != nil {
				continue
			}
			w.mu.Lock()
			p.requeueParked(false)
			ds := w.q.take(p, w.cfg.Prefetch, w.now())
			if w.cfg.AckWait > 0 {
				for _, d := range ds {
					w.q.flight[d.tag].ackBy = w.now().Add(time.Duration(w.cfg.AckWait) * time.Second)
				}
			}
			w.mu.Unlock()
			for _, d := range ds {
				w.logf("%s takes %s (delivery %d, tag %d)", p.name, d.id, d.count, d.tag)
			}
			p.mu.Lock()
			p.held = append(p.held, ds...)
			p.mu.Unlock()
			continue
		}
		p.mu.Lock()
		if w.cfg.Batch {
			// First deliveries go as a batch; a delivery with any
			// evidence of an earlier one goes through the core alone, so
			// that a message that kills or hangs its batch gets counted
			// (a batch's failures are nobody's).
			var batch, rest []qdel
			for _, d := range p.held {
				// (ProcessBatch takes ids of one consumer column: a
				// batch is of the first queue's messages, with ids.)
				if space, id := msgOf(d.id); d.count == 1 && space == "" && id != "" {
					batch = append(batch, d)
				} else {
					rest = append(rest, d)
				}
			}
			if len(batch) >= 2 {
				p.held = rest
				p.mu.Unlock()
				p.deliverBatch(batch)
				continue
			}
		}
		d := p.held[0]
		p.held = p.held[1:]
		p.mu.Unlock()
		p.deliver(d)
	}
}

// deliverBatch runs the deliveries ds, two or more, as one batch through
// inbox.SQL's ProcessBatch (Config.Batch): one transaction, bounded by
// the processing limit, and every delivery acked once it commits (a
// duplicate too). A batch that fails goes through the message core one
// delivery at a time (deliver): the core counts the failures and
// dead-letters, and a tombstone's ErrDeadLettered there has its message
// dead-lettered again. A shutdown's deliveries go back through the core
// too (deliver's Stopping).
func (p *proc) deliverBatch(ds []qdel) {
	w := p.w
	p.n++
	// The batch's own run: its turns' name; not a run of the core's, so
	// not in w.runs (the ledger never hears of it, and the budget counts
	// only the core's runs).
	r := &runRec{id: p.name + "#" + strconv.Itoa(p.n), msg: "batch"}
	ids := make([]string, len(ds))
	msgs := make([]*inbox.Message, len(ds))
	for i, d := range ds {
		ids[i] = d.id
		msgs[i] = &inbox.Message{ID: d.id, Source: "queue", Redelivered: d.redelivered}
	}
	w.logf("%s runs %v as a batch", p.name, ids)
	w.stat("batch")
	// (Its deadline off any other timer's instant, another batch's begun
	// at the same instant included, by a nanosecond part of its own.)
	lim := time.Duration(w.cfg.Limit)*time.Second + w.dur(r.id, "batch", time.Microsecond)
	ctx, cancel := context.WithTimeout(context.WithValue(p.ctx, runKey, r), lim)
	_, err := p.in.ProcessBatch(ctx, "group", ids, func(ctx context.Context, tx *sql.Tx, i int) error {
		w.mu.Lock()
		w.handled[ids[i]]++
		n := w.handled[ids[i]]
		w.mu.Unlock()
		return p.effect(context.WithValue(ctx, nKey, n), tx, msgs[i])
	})
	cancel()
	if err == nil {
		if w.turn(context.Background(), p, r, "settle") != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, d := range ds {
			if _, ok := w.q.ack(d.tag); !ok {
				w.logf("%s acks %s: stale tag %d", p.name, d.id, d.tag)
				continue
			}
			w.acked[d.id]++
			w.logf("%s acks %s (tag %d, batch)", p.name, d.id, d.tag)
			if w.db.effects[d.id] == 0 {
				w.failf(invAcked, d.id, "%s acked %s (in a batch), whose effect has not committed", p.name, d.id)
			}
		}
		return
	}
	w.logf("%s: the batch failed (%v): one by one through the core", p.name, err)
	w.stat("batch failed")
	for _, d := range ds {
		if p.isDead() {
			return
		}
		p.deliver(d)
	}
}

// handBack runs what p holds through the core at its shutdown: each
// goes back unrun.
func (p *proc) handBack() {
	p.mu.Lock()
	held := p.held
	p.held = nil
	p.mu.Unlock()
	for _, d := range held {
		if p.isDead() {
			return
		}
		p.deliver(d)
	}
	p.mu.Lock()
	n := len(p.parked)
	p.mu.Unlock()
	if n == 0 || p.w.turn(context.Background(), p, nil, "stop") != nil {
		return
	}
	p.w.mu.Lock()
	p.requeueParked(true)
	p.w.mu.Unlock()
}

// requeueParked requeues (nacks) the deliveries p holds for their delay
// that are due, or all of them (a shutdown: contrib/rabbitmq's stop), at
// once. w.mu is held.
func (p *proc) requeueParked(all bool) {
	w := p.w
	now := w.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := p.parked[:0]
	for _, h := range p.parked {
		m, live := w.q.flight[h.d.tag]
		if live && !all && m.due.After(now) {
			keep = append(keep, h)
			continue
		}
		switch {
		case !live:
			w.logf("%s requeues %s, held for its delay: stale tag %d", p.name, h.d.id, h.d.tag)
		case plant.HeldReject: // a planted bug (internal/plant), false but in a test build
			_, _ = w.q.deadLetter(h.d.tag)
			w.dead[h.d.id]++
			w.logf("%s nacks %s, held for its delay, without requeue: dead-lettered (tag %d)", p.name, h.d.id, h.d.tag)
			w.checkBudget(h.r, h.dec)
		default:
			_, _ = w.q.requeue(h.d.tag, now)
			w.logf("%s requeues %s, held for its delay (tag %d)", p.name, h.d.id, h.d.tag)
		}
	}
	clear(p.parked[len(keep):])
	p.parked = keep
}

// newRun records a new run of msg by p.
func (p *proc) newRun(msg string) *runRec {
	p.n++
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	r := &runRec{id: p.name + "#" + strconv.Itoa(p.n), seq: len(w.runs) + 1, msg: msg, epoch: w.epoch[msg]}
	w.runs = append(w.runs, r)
	return r
}

// deliver runs one queue delivery through the Runner and settles it.
func (p *proc) deliver(d qdel) {
	w := p.w
	r := p.newRun(d.id)
	r.tag = d.tag
	space, id := msgOf(d.id)
	m := &inbox.Message{ID: id, IDSpace: space, Source: "queue", Redelivered: d.redelivered}
	evidence := d.redelivered
	if w.cfg.Counting {
		// A quorum queue's count: it also counts the requeues of
		// shutdowns, prefetches and releases, so it says only that the
		// message was delivered before.
		m.Header = map[string][]string{"x-delivery-count": {strconv.Itoa(d.count - 1)}}
		evidence = d.count > 1
	}
	arrival := inbox.Arrival{HasID: id != "", Stopping: p.ctx.Err() != nil, MaybeRedelivered: evidence}
	ctx := context.WithValue(p.ctx, runKey, r)
	dec, core := p.runner.Deliver(ctx, m, inbox.Key{IDSpace: space, ID: id}, arrival, inbox.Hooks{Release: func() { p.release(r, d) }, Beat: func() { p.beat(d) }})
	if err := w.turn(context.Background(), p, r, "settle"); err != nil {
		return
	}
	w.checkCore(p, r, dec, core)
	if dec.Verb == inbox.VerbDeadLetter {
		p.deadLetter(ctx, r, d, dec, core)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	switch dec.Verb {
	case inbox.VerbAck:
		if id == "" {
			w.failf(invNoID, d.id, "%s acked %s, a message without an id", p.name, d.id)
		}
		if _, ok := w.q.ack(d.tag); ok {
			w.acked[d.id]++
			w.logf("%s acks %s (tag %d)", p.name, d.id, d.tag)
			if w.db.effects[d.id] == 0 {
				w.failf(invAcked, d.id, "%s acked %s, whose effect has not committed", p.name, d.id)
			}
		} else {
			w.logf("%s acks %s: stale tag %d", p.name, d.id, d.tag)
		}
	case inbox.VerbRequeue:
		if w.cfg.Hold && dec.Delay > 0 && p.ctx.Err() == nil {
			// contrib/rabbitmq's hold: kept unacknowledged for the delay,
			// outside the prefetch, then requeued (requeueParked).
			if _, ok := w.q.park(d.tag, now.Add(dec.Delay)); ok {
				p.mu.Lock()
				p.parked = append(p.parked, parkedDel{d: d, r: r, dec: dec})
				p.mu.Unlock()
				w.logf("%s holds %s for %v (%s, %d failed runs)", p.name, d.id, dec.Delay, core.State(), dec.Failures)
				w.stat("held for its delay")
			} else {
				w.logf("%s holds %s: stale tag %d", p.name, d.id, d.tag)
			}
			return
		}
		if w.cfg.Hold && p.ctx.Err() != nil {
			dec.Delay = 0 // contrib/rabbitmq: back at once during a shutdown
		}
		if _, ok := w.q.requeue(d.tag, now.Add(dec.Delay)); ok {
			w.logf("%s requeues %s after %v (%s, %d failed runs)", p.name, d.id, dec.Delay, core.State(), dec.Failures)
		} else {
			w.logf("%s requeues %s: stale tag %d", p.name, d.id, d.tag)
		}
	default:
		if core.State() != inbox.StateReleased {
			_, _ = w.q.requeue(d.tag, now)
		}
	}
}

// beat is the Runner's Beat hook (Config.AckWait): the delivery's ack
// wait starts again (JetStream's AckProgress, an SQS visibility
// extension). It runs at its ticker's instant, outside any turn: it
// only moves a deadline that the driver reads between steps.
func (p *proc) beat(d qdel) {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if m, ok := w.q.flight[d.tag]; ok && w.cfg.AckWait > 0 && !p.isDead() {
		m.ackBy = w.now().Add(time.Duration(w.cfg.AckWait) * time.Second)
	}
	w.stat("beat")
}

// ackBeat is the Runner's beat interval for an ack wait of seconds: a
// third of it, off any other timer's instant by its nanoseconds.
func ackBeat(seconds int) time.Duration { return time.Duration(seconds)*time.Second/3 + 7919 }

// ackWaits ends the ack wait of every delivery in flight not renewed in
// time (Config.AckWait): ready for anyone, its holder's tag stale. A
// handler that runs beats every third of the ack wait, so the ack wait
// of its delivery ends only before its first beat (it began its ack wait
// when it was taken, ahead of its run or of its ledger writes), or past
// its processing limit.
func (w *world) ackWaits() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	// (At its processing limit the Runner stops beating and releases the
	// delivery: past it, the ack wait may end first.)
	lim := time.Duration(w.cfg.Limit) * time.Second
	every := ackBeat(w.cfg.AckWait)
	for _, tag := range w.q.tagsOf(nil) {
		m := w.q.flight[tag]
		if m.ackBy.IsZero() || m.ackBy.After(now) || m.parked {
			continue
		}
		for _, r := range w.runs {
			if r.live && r.tag == tag && now.Sub(r.started) > every && now.Sub(r.started) < lim {
				w.failLocked(invBeat, m.id, "the ack wait of %s ended while %s's handler had run for %v and beats every %v", m.id, r.id, now.Sub(r.started).Round(time.Millisecond), every)
			}
		}
		w.q.expire(tag, now)
		w.logf("the ack wait of %s (tag %d, held by %s) runs out: ready for anyone", m.id, tag, m.holderName())
		w.stat("ack wait ran out")
	}
}

// errStaleTag is a dead letter on a spent delivery tag (a reject on a
// channel that closed): it failed.
var errStaleTag = errors.New("msgsim: stale delivery tag")

// errDLFailed is a dead letter that failed (Config.DLFail): before it
// landed, or after, its answer lost.
var errDLFailed = errors.New("msgsim: the dead letter failed")

// The dead letter faults (Config.DLFail).
const (
	dlNone   = iota
	dlBefore // it fails before it lands: nothing in the dead-letter destination
	dlLost   // it lands, and its answer is lost: the shell is told it failed
)

// dlFault draws whether the dead letter being sent fails, and how. It is
// called in a turn, w.mu held.
func (w *world) dlFault() int {
	if !w.faulty || w.cfg.DLFail <= 0 || w.drng.IntN(100) >= w.cfg.DLFail {
		return dlNone
	}
	w.stat("dead letter failed")
	return dlBefore + w.drng.IntN(2)
}

// deadLetter gives d to the dead-letter destination and tells the core
// how that went (the RabbitMQ adapter's reject): its ledger record goes
// only once it is done; a stale tag keeps it, and the queue's own
// redelivery is dead-lettered on arrival.
func (p *proc) deadLetter(ctx context.Context, r *runRec, d qdel, dec inbox.Decision, core *inbox.Delivery) {
	w := p.w
	w.mu.Lock()
	w.checkBudget(r, dec)
	var err error
	fail := w.dlFault()
	if _, ok := w.q.flight[d.tag]; ok && fail == dlBefore {
		// The reject never reached the broker (its channel closed): the
		// delivery goes back to the queue.
		_, _ = w.q.requeue(d.tag, w.now())
		err = errDLFailed
		w.logf("%s dead-letters %s: failed before it landed, returned", p.name, d.id)
	} else if _, ok := w.q.deadLetter(d.tag); ok {
		w.dead[d.id]++
		if rd := w.redriven[d.id]; rd != nil && rd.published && r.seq > rd.seq {
			rd.deadAfter++
		}
		if fail == dlLost {
			err = errDLFailed
			w.logf("%s dead-letters %s (%d failed runs: %v): landed, its answer lost", p.name, d.id, dec.Failures, dec.Err)
		} else {
			w.dlOK[d.id] = true
			w.logf("%s dead-letters %s (%d failed runs: %v)", p.name, d.id, dec.Failures, dec.Err)
		}
	} else {
		err = errStaleTag
		w.logf("%s dead-letters %s: stale tag %d, its record kept", p.name, d.id, d.tag)
	}
	w.mu.Unlock()
	space, id := msgOf(d.id)
	after := p.runner.DeadLettered(ctx, core, inbox.Key{IDSpace: space, ID: id}, err)
	w.checkCore(p, r, after, core)
}

// release is the Runner's Release hook: at the processing limit, the
// delivery and every one taken ahead go back at once, for another
// consumer (the RabbitMQ adapter cancels its subscription and nacks
// them).
func (p *proc) release(r *runRec, d qdel) {
	w := p.w
	if err := w.turn(context.Background(), p, r, "release"); err != nil {
		return
	}
	p.mu.Lock()
	held := p.held
	p.held = nil
	p.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	_, ok := w.q.requeue(d.tag, now)
	w.logf("%s releases %s at the processing limit (tag %d, live %v), and %d taken ahead", p.name, d.id, d.tag, ok, len(held))
	for _, h := range held {
		_, _ = w.q.requeue(h.tag, now)
	}
	w.stat("released at the limit")
}

// checkCore fails the seed on a move the core refused.
func (w *world) checkCore(p *proc, r *runRec, dec inbox.Decision, core *inbox.Delivery) {
	if len(core.Refused()) > 0 {
		w.failf(invCore, r.msg, "%s: the core refused %v", p.name, core.Refused())
	}
	if st := core.State(); dec.Verb == inbox.VerbNone && st != inbox.StateReleased && st != inbox.StateDeadLettered && !p.isDead() {
		w.failf(invCore, r.msg, "%s: no decision for %s in %s: %v", p.name, r.msg, core.State(), dec.Err)
	}
}

// ledgerApplied tells the oracle of a ledger write that was applied (in
// a commit, whatever the commit answered). w.mu is held.
func (w *world) ledgerApplied(tx *dbTx, o ledgerOp) {
	r := tx.run
	id := keyOfRow(o.key)
	if (tx.p == w.operator || tx.p == w.pruner) && o.op == inbox.OpForget {
		// The operator's redrive forgets the ledger's record (the dead
		// letter in hand), or a prune does: a new epoch.
		w.epoch[id]++
		return
	}
	if r == nil {
		return
	}
	switch o.op {
	case inbox.OpBegin:
		// The core decides from the record as it was before.
		r.budget, r.snap = w.budget(r), true
		r.begun = true
		r.markAt = w.epoch[id]
	case inbox.OpFail, inbox.OpFailBegun:
		if o.op == inbox.OpFailBegun {
			r.begun = false
		}
		r.counted, r.countAt = true, w.epoch[id]
		lim := time.Duration(w.cfg.Limit) * time.Second
		limitNow := r.live && w.now().Sub(r.started) >= lim && r.out == outNone
		if !r.out.real() && !limitNow {
			w.failLocked(invCounted, id, "%s's run %s counted as a failure, but it ended as %s", id, r.id, r.out)
		}
		// The core decides from the record after it.
		r.budget, r.snap = w.budget(r), true
	case inbox.OpExcuse:
		r.begun = false
	case inbox.OpForget:
		w.epoch[id]++
		if w.db.effects[id] == 0 && !w.dlOK[id] {
			w.failLocked(invForgot, id, "%s's ledger record forgotten (by %s), but its effect has not committed and no dead letter of it is known to have landed", id, r.id)
		}
	}
}

// budget is what the ledger may count against r's message in its
// current epoch (since its record was last forgotten), each unit a run:
// a failure counted in it (invCounted checks that each was a real one),
// a marker placed in it and still open (a run that died, one live
// elsewhere at this moment, one whose closing write was lost: the
// imprecisions docs/consumer.md names), or a real failure the ledger
// never counted (its write lost; a first delivery's run that died). r
// itself is left out when it never ran (a message dead-lettered on
// arrival, exhausted). w.mu is held.
func (w *world) budget(r *runRec) int {
	e := w.epoch[r.msg]
	n := 0
	for _, o := range w.runs {
		if o.msg != r.msg || (o == r && !o.ran) {
			continue
		}
		switch {
		case o.counted:
			if o.countAt == e {
				n++
			}
		case o.begun:
			if o.markAt == e {
				n++
			}
		case o.out.real() && o.epoch == e:
			n++
		}
	}
	return n
}

// checkBudget fails the seed when r's message is dead-lettered before its
// handler's runs failed as often as the policy allows. w.mu is held.
func (w *world) checkBudget(r *runRec, dec inbox.Decision) {
	if errors.Is(dec.Err, inbox.ErrNoMessageID) {
		// Config.NoIDs: dead-lettered on arrival, as the policy says.
		if _, id := msgOf(r.msg); id != "" {
			w.failLocked(invBudget, r.msg, "%s dead-lettered for want of an id, but it has one: %v", r.msg, dec.Err)
		}
		return
	}
	if errors.Is(dec.Err, inbox.ErrDeadLettered) {
		// A message dead-lettered before, again (its tombstone's answer):
		// the budget was checked at the first dead letter. The tombstone
		// must be there.
		rd := w.redriven[r.msg]
		// (A redrive that began after this run did may have cleared the
		// tombstone the run met.)
		if w.db.inbox[rowOf(r.msg)] != 4 && (rd == nil || rd.published && r.seq > rd.seq) {
			w.failLocked(invBudget, r.msg, "%s dead-lettered as dead-lettered before, but the inbox holds no tombstone of it", r.msg)
		}
		if rd != nil && rd.published && r.seq > rd.seq && w.tombs[r.msg] == rd.tombs {
			w.failLocked(invRedrive, r.msg, "%s, redriven, dead-lettered again (%s) by a tombstone from before its redrive", r.msg, r.id)
		}
		return
	}
	n := r.budget
	if !r.snap {
		n = w.budget(r)
	}
	if n < w.cfg.MaxDeliveries {
		w.failLocked(invBudget, r.msg, "%s (%s) dead-lettered after %d failed runs (or runs that may have failed), the policy allows %d; the core said %d: %v",
			r.msg, w.behaviour[r.msg], n, w.cfg.MaxDeliveries, dec.Failures, dec.Err)
	}
}

// crash kills p: its transactions rolled back, its deliveries returned,
// its memory gone.
func (w *world) crash(p *proc, why string) {
	w.mu.Lock()
	if p.dead.Swap(true) {
		w.mu.Unlock()
		return
	}
	close(p.killed)
	p.cancel()
	w.killTxs(p)
	for _, r := range w.runs {
		if r.live && strings.HasPrefix(r.id, p.name+"#") {
			r.out = outDied
		}
	}
	returned := 0
	if w.cfg.Kafka {
		w.assign()
	} else {
		returned = w.q.crash(p, w.now())
	}
	w.mu.Unlock()
	p.mu.Lock()
	p.held = nil
	p.parked = nil
	p.mu.Unlock()
	w.logf("%s crashes (%s): %d deliveries returned", p.name, why, returned)
	w.stat("crash")
}

// exit ends p's main goroutine.
func (p *proc) exit() {
	w := p.w
	w.mu.Lock()
	p.exited = true
	if w.cfg.Kafka {
		w.assign()
	}
	w.mu.Unlock()
	_ = p.db.Close()
}

// fault injects one fault, and reports whether it did.
func (w *world) fault() bool {
	type choice struct {
		weight int
		f      func() bool
	}
	live := func() *proc {
		var ps []*proc
		for _, p := range w.slots {
			if !p.isDead() && p.ctx.Err() == nil {
				ps = append(ps, p)
			}
		}
		if len(ps) == 0 {
			return nil
		}
		return ps[w.rng.IntN(len(ps))]
	}
	choices := []choice{
		{w.cfg.Shutdowns, func() bool {
			p := live()
			if p == nil {
				return false
			}
			w.logf("%s shuts down", p.name)
			w.stat("shutdown")
			p.cancel()
			return true
		}},
		{2 * min(w.cfg.Crashes-w.crashes, 1), func() bool {
			p := live()
			if p == nil {
				return false
			}
			w.crashes++
			w.crash(p, "a fault")
			return true
		}},
		{w.cfg.DBDown, func() bool {
			w.mu.Lock()
			w.db.down = !w.db.down
			down := w.db.down
			w.mu.Unlock()
			w.logf("database down: %v", down)
			if down {
				w.stat("database down")
			}
			return true
		}},
	}
	if w.cfg.Kafka {
		choices = append(choices, choice{w.cfg.Rebalance, w.rebalance})
	} else {
		choices = append(choices, choice{w.cfg.Expire, w.expire})
		// Last, so that the other faults' draws are as they were in a
		// world without them.
		if w.cfg.Redrive > 0 {
			choices = append(choices, choice{w.cfg.Redrive, w.redrive})
		}
		if w.cfg.Prune > 0 {
			choices = append(choices, choice{w.cfg.Prune, w.prune})
		}
	}
	total := 0
	for _, c := range choices {
		total += max(c.weight, 0)
	}
	if total == 0 {
		return false
	}
	x := w.rng.IntN(total)
	for _, c := range choices {
		if x < max(c.weight, 0) {
			return c.f()
		}
		x -= max(c.weight, 0)
	}
	return false
}

// redrive starts an operator's redrive of a dead letter taken from the
// dead-letter destination (Config.Redrive): one at a time, of a message
// with an id.
func (w *world) redrive() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.operating {
		return false
	}
	var with []int
	for i, id := range w.q.dead {
		if _, mid := msgOf(id); mid != "" {
			with = append(with, i)
		}
	}
	if len(with) == 0 {
		return false
	}
	i := with[w.rng.IntN(len(with))]
	key := w.q.dead[i]
	w.q.dead = append(w.q.dead[:i:i], w.q.dead[i+1:]...)
	if w.operator == nil {
		ctx, cancel := context.WithCancel(context.Background())
		op := &proc{w: w, slot: -1, name: "op", ctx: ctx, cancel: cancel, killed: make(chan struct{})}
		op.db = openDB(op)
		op.in = &inbox.SQL{DB: op.db}
		w.operator = op
	}
	w.operating = true
	w.redriven[key] = &redriveRec{tombs: w.tombs[key]}
	w.logf("the operator redrives %s", key)
	w.stat("redrive")
	go w.operate(key)
	return true
}

// operate is the operator's redrive of key: SQLLedger.Redrive until it
// succeeds (the database may be down, a commit may fail), then the dead
// letter published again.
func (w *world) operate(key string) {
	op := w.operator
	space, id := msgOf(key)
	l := op.in.Ledger("group")
	for {
		cleared, err := l.Redrive(op.ctx, inbox.Key{IDSpace: space, ID: id})
		if err == nil {
			w.logf("the operator's redrive of %s: tombstone cleared %v", key, cleared)
			break
		}
		if op.ctx.Err() != nil {
			return // the teardown
		}
		w.logf("the operator's redrive of %s failed (%v): again in a second", key, err)
		time.Sleep(time.Second + w.dur("op", key, time.Microsecond))
	}
	if w.turn(op.ctx, op, nil, "publish") != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	rd := w.redriven[key]
	rd.published, rd.seq = true, len(w.runs)
	w.q.publish(key, w.now())
	w.operating = false
	w.logf("the operator publishes %s again", key)
}

// deliverable reports whether the broker may still deliver a copy of the
// message key: a copy not settled, a producer's duplicate still to come,
// a dead letter the operator may redrive (or is redriving). w.mu is
// held.
func (w *world) deliverable(key string) bool {
	if w.late && w.dup[key] {
		return true
	}
	for _, m := range w.q.msgs {
		if m.id == key && !m.done {
			return true
		}
	}
	if w.cfg.Redrive > 0 {
		if rd := w.redriven[key]; rd != nil && !rd.published {
			return true
		}
		for _, id := range w.q.dead {
			if id == key {
				return true
			}
		}
	}
	return false
}

// horizon is the broker's redelivery horizon now: the age of the oldest
// row, in the inbox or the ledger, of a message it may still deliver
// (zero for none), committed or written by a transaction still open
// (which stamps it at its statement, not at its commit). w.mu is held.
func (w *world) horizon() time.Duration {
	now := w.now().UnixMicro()
	oldest := now
	ats := []map[rowKey]int64{w.db.inboxAt, w.db.ledgerAt}
	for tx := range w.db.open {
		ats = append(ats, tx.at, tx.lat)
	}
	for _, at := range ats {
		for k, t := range at {
			if t < oldest && w.deliverable(keyOfRow(k)) {
				oldest = t
			}
		}
	}
	return time.Duration(now-oldest) * time.Microsecond
}

// prune starts a run of inbox.SQL's Prune (Config.Prune) at the age the
// docs require: older than the broker's redelivery horizon, and up to a
// minute more.
func (w *world) prune() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pruning {
		return false
	}
	if w.pruner == nil {
		ctx, cancel := context.WithCancel(context.Background())
		pr := &proc{w: w, slot: -1, name: "pruner", ctx: ctx, cancel: cancel, killed: make(chan struct{})}
		pr.db = openDB(pr)
		// The minimum the world's short lives need: the age is the docs'.
		pr.in = &inbox.SQL{DB: pr.db, MinRetention: time.Microsecond}
		w.pruner = pr
	}
	// The horizon now, and as much as the prune may take: its statements
	// run within pruneFor (then they fail), and no message becomes
	// deliverable again meanwhile (a dead letter the operator may
	// redrive, a duplicate to come, count as deliverable already), so
	// the horizon then is no longer than this age.
	age := w.horizon() + pruneFor + time.Millisecond + time.Duration(w.rng.IntN(60000))*time.Millisecond
	w.pruning = true
	w.prunes++
	n := w.prunes
	w.logf("the pruner prunes what is older than %v", age)
	w.stat("prune")
	go func() {
		ctx, cancel := context.WithTimeout(w.pruner.ctx, pruneFor-w.dur(w.pruner.name+strconv.Itoa(n), "prune", time.Microsecond))
		pruned, err := w.pruner.in.Prune(ctx, age)
		cancel()
		w.mu.Lock()
		w.pruning = false
		w.mu.Unlock()
		w.logf("the pruner pruned %d ids (%v)", pruned, err)
	}()
	return true
}

// pruneFor bounds a prune's statements.
const pruneFor = 2 * time.Second

// pruned checks a row the pruner deleted from the inbox (at its commit).
// w.mu is held.
func (w *world) pruned(k rowKey) {
	key := keyOfRow(k)
	w.stat("pruned")
	w.logf("pruner: %s's row pruned", key)
	if w.deliverable(key) {
		w.failLocked(invPrune, key, "the row of %s pruned, but the broker may still deliver it", key)
	}
}

// expire ends the ack wait of a delivery in flight.
func (w *world) expire() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	tags := w.q.tagsOf(nil)
	if len(tags) == 0 {
		return false
	}
	tag := tags[w.rng.IntN(len(tags))]
	m := w.q.expire(tag, w.now())
	w.logf("the ack wait of %s (tag %d, held by %s) ends: ready for anyone", m.id, tag, m.holderName())
	w.stat("ack wait ended")
	return true
}

func (m *qmsg) holderName() string {
	if m.holder == nil {
		return "nobody"
	}
	return m.holder.name
}

// restart starts a new process for every consumer whose process died or
// has exited after a shutdown.
func (w *world) restart() {
	started := false
	for i, p := range w.slots {
		w.mu.Lock()
		gone := p.isDead() || p.exited
		w.mu.Unlock()
		if gone && !w.tearing.Load() {
			w.start(i)
			started = true
		}
	}
	if started {
		synctest.Wait() // until each new process waits for its first turn
	}
}

// settled reports whether every message is settled and nothing is under
// way.
func (w *world) settled() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cfg.Kafka {
		if !w.t.settled() {
			return false
		}
	} else if !w.q.settled() {
		return false
	}
	if w.operating || w.pruning {
		return false
	}
	for k := range w.pending {
		if !strings.HasSuffix(k, "/fetch") {
			return false
		}
	}
	for _, r := range w.runs {
		if r.live {
			return false
		}
	}
	return true
}

// sleep lets virtual time pass: a little, or, when nothing can move, up
// to the next message due.
func (w *world) sleep(idle bool) {
	d := time.Duration(1+w.rng.IntN(1500))*time.Millisecond + time.Duration(w.rng.IntN(999983))
	if idle {
		w.mu.Lock()
		var next time.Time
		var ok bool
		if w.cfg.Kafka {
			next, ok = w.t.nextDue(w.now())
		} else {
			next, ok = w.q.nextDue(w.now())
		}
		w.mu.Unlock()
		if ok {
			d = next.Sub(w.now()) + time.Duration(1+w.rng.IntN(999983))
		}
	}
	time.Sleep(d)
}

// maxRecovery bounds the recovery: steps, and virtual time.
const (
	maxRecoverySteps = 3000
	maxRecoveryTime  = 2 * time.Hour
)

// run runs the world, its faults and its recovery, checks the end, and
// tears it down.
func (w *world) run() {
	w.t0 = w.now()
	w.faulty = true
	now := w.now()
	w.mu.Lock()
	if w.cfg.Kafka {
		w.t = newTopic(max(w.cfg.Partitions, 1))
	}
	for _, id := range w.ids {
		w.publish(id, now)
		if w.dup[id] && w.cfg.LateDups <= 0 {
			w.publish(id, now)
		}
	}
	w.mu.Unlock()
	w.late = w.cfg.LateDups > 0
	w.slots = make([]*proc, max(w.cfg.Consumers, 1))
	w.gens = make([]int, len(w.slots))
	for i := range w.slots {
		w.start(i)
	}
	var recoveryFrom time.Time
	for step := 0; ; step++ {
		// What the last step set going logs under its number.
		synctest.Wait()
		w.step.Store(int64(step))
		w.restart()
		if w.cfg.AckWait > 0 {
			w.ackWaits()
		}
		if w.late && (step >= w.cfg.LateDups || step >= w.cfg.Steps) {
			// Config.LateDups: the producer's duplicates, now.
			w.mu.Lock()
			w.late = false
			for _, id := range w.ids {
				if w.dup[id] {
					w.publish(id, w.now())
					w.logf("the producer publishes %s again", id)
				}
			}
			w.mu.Unlock()
		}
		if w.faulty && step >= w.cfg.Steps {
			w.faulty = false
			recoveryFrom = w.now()
			w.mu.Lock()
			w.db.down = false
			w.mu.Unlock()
			w.logf("recovery: the faults stop")
		}
		if !w.faulty {
			if w.settled() {
				break
			}
			if step-w.cfg.Steps > maxRecoverySteps || w.now().Sub(recoveryFrom) > maxRecoveryTime {
				w.failf(invLive, "", "not settled %v and %d steps after the faults stopped", w.now().Sub(recoveryFrom).Round(time.Second), step-w.cfg.Steps)
				break
			}
		}
		if w.faulty && w.rng.IntN(10) == 0 && w.fault() {
			continue
		}
		keys := w.eligible()
		if debugTurns {
			w.logf("turns %v", keys)
		}
		if len(keys) == 0 {
			w.sleep(true)
			continue
		}
		if w.rng.IntN(5) == 0 {
			w.sleep(false)
			continue
		}
		w.grant(keys[w.rng.IntN(len(keys))])
	}
	if w.faulty || w.settled() {
		w.check() // else the liveness failure says it all
	}
	w.teardown()
}

func (w *world) publish(id string, now time.Time) {
	if w.cfg.Kafka {
		w.t.publish(id)
	} else {
		w.q.publish(id, now)
	}
}

// check checks the end: every message's effect once, or its dead letter,
// never both.
func (w *world) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range w.ids {
		eff, dead := w.db.effects[id], w.dead[id]
		if rd := w.redriven[id]; rd != nil && rd.published {
			// Config.Redrive: what its runs since the redrive did.
			switch {
			case eff == 0 && rd.deadAfter == 0:
				w.failLocked(invRedrive, id, "%s (%s), redriven, neither ran to its effect nor was dead-lettered again", id, w.behaviour[id])
			case eff > 0 && rd.deadAfter > 0:
				w.failLocked(invBoth, id, "%s (%s), redriven, has its effect and was dead-lettered again", id, w.behaviour[id])
			}
			continue
		}
		switch {
		case eff == 0 && dead == 0:
			w.failLocked(invLost, id, "%s (%s) lost: no effect, no dead letter", id, w.behaviour[id])
		case eff > 0 && dead > 0:
			// Producer duplicates too: the second broker message of an
			// id meets the first's tombstone, or its processed row.
			w.failLocked(invBoth, id, "%s (%s) has its effect and was dead-lettered", id, w.behaviour[id])
		}
	}
}

// teardown shuts every process down and lets every goroutine end.
func (w *world) teardown() {
	w.tearing.Store(true)
	w.faulty = false
	for _, p := range w.slots {
		p.cancel()
	}
	if w.operator != nil {
		w.operator.cancel()
	}
	if w.pruner != nil {
		w.pruner.cancel()
	}
	for i := 0; i < 100000; i++ {
		synctest.Wait()
		w.mu.Lock()
		done := true
		for _, p := range w.slots {
			done = done && (p.exited || p.isDead())
		}
		w.mu.Unlock()
		if done {
			break
		}
		if keys := w.eligible(); len(keys) > 0 {
			w.grant(keys[0])
			continue
		}
		time.Sleep(time.Second)
	}
	// Hung handlers of dead processes sleep out their hang.
	time.Sleep(3 * time.Duration(w.cfg.Limit+1) * time.Second)
	synctest.Wait()
	if w.operator != nil {
		_ = w.operator.db.Close()
	}
	if w.pruner != nil {
		_ = w.pruner.db.Close()
	}
	w.mu.Lock()
	left := len(w.pending)
	w.mu.Unlock()
	if left > 0 {
		w.failf(invLeak, "", "%d goroutines still wait for a turn after the teardown", left)
		for _, k := range w.eligible() {
			w.grant(k)
		}
		synctest.Wait()
	}
}

// result is w's result.
func (w *world) result() *Result {
	w.tmu.Lock()
	defer w.tmu.Unlock()
	h := sha256.New()
	for _, l := range w.trace {
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	w.mu.Lock()
	fmt.Fprintf(h, "end: effects %v dead %v ledger %v inbox %d\n", w.db.effects, w.dead, w.db.ledger, len(w.db.inbox))
	w.mu.Unlock()
	fs := append([]Failure(nil), w.failures...)
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].Step < fs[j].Step })
	stats := map[string]int{}
	for k, v := range w.stats {
		stats[k] = v
	}
	return &Result{Seed: w.seed, Config: w.cfg, Failures: fs, Trace: w.trace, Hash: hex.EncodeToString(h.Sum(nil)[:8]),
		Stats: stats, Steps: int(w.step.Load())}
}

// RunSeed runs seed's world with cfg in a synctest bubble of its own, as
// a subtest of t that does not fail t: the result says what broke.
func RunSeed(t *testing.T, seed uint64, cfg Config) (res *Result) {
	var w *world
	defer func() {
		if r := recover(); r != nil {
			// A goroutine of the world that never ends (synctest's
			// "deadlock"): a leak, in the world or in the code it runs.
			f := Failure{Inv: invLeak, Text: fmt.Sprint(r)}
			if w == nil {
				res = &Result{Seed: seed, Config: cfg, Failures: []Failure{f}}
				return
			}
			w.failures = append(w.failures, f)
			res = w.result()
		}
	}()
	synctest.Test(t, func(*testing.T) {
		w = newWorld(seed, cfg)
		w.run()
		res = w.result()
	})
	return res
}
