package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/idemkit/idemhttp/inbox"
)

// Behaviour is how a message's handler behaves in a [World].
type Behaviour uint8

const (
	// Healthy: the handler commits its effect.
	Healthy Behaviour = iota
	// Poison: the handler always fails.
	Poison
	// Flaky: the handler fails on its first two runs, then commits.
	Flaky
	// Killer: the handler kills its consumer's process, every time.
	Killer
	// Hanger: the handler passes its processing limit, every time, and
	// then fails.
	Hanger
)

var behaviourNames = [...]string{"healthy", "poison", "flaky", "killer", "hanger"}

// String returns the behaviour's name.
func (b Behaviour) String() string { return behaviourNames[b] }

// WorldConfig shapes a [World]. The zero value is a small world without
// faults.
type WorldConfig struct {
	// Messages is how many messages are published; each is given a
	// behaviour at random, Healthy most often.
	Messages int
	// Consumers is how many consumers share the queue (at least one).
	Consumers int
	// Prefetch is how many deliveries a consumer takes ahead (at least
	// one).
	Prefetch int
	// Policy is the core's policy; its Retry's delays are virtual.
	Policy inbox.Policy
	// Faults is how many fault steps (shutdowns, crashes, duplicated
	// deliveries, database outages) the world draws before it lets the
	// consumers finish.
	Faults int
	// ProducerDuplicates publishes some messages twice (a producer's
	// retry: a second broker message with the same id).
	ProducerDuplicates bool
	// DeadLetterFaults makes one dead letter in three fail (a produce, a
	// reject on a channel that just closed): the message stays with the
	// broker, handed back after the core's delay. Its redelivery must
	// never run: its record, with its count, was kept.
	DeadLetterFaults bool

	// CountShutdowns is a planted bug: the shell tells the core that a
	// handler a shutdown interrupted failed on its own. The invariants
	// must catch it.
	CountShutdowns bool
}

// World is a seeded simulation of consumers running the message core
// ([inbox.Delivery]) against a modelled broker ([Broker]) and inbox
// database ([Store]), in virtual time, with no goroutine: the same seed
// gives the same run. [World.Step] takes one step (drawn from the seed);
// [World.Run] steps through the faults and then until every message is
// settled, and [World.Check] says whether the invariants held:
//
//   - every message's effect ran at most once, at every step;
//   - every message is settled in the end: its effect committed once, or
//     dead-lettered;
//   - a message is dead-lettered only after real handler failures (runs
//     that failed, met a database outage or killed their consumer) at
//     least as many as the policy allows; never for shutdowns,
//     prefetches handed back or duplicated deliveries.
//
// The simulator drives it as it drives the client: one World per seed.
type World struct {
	cfg       WorldConfig
	rng       *rand.Rand
	Broker    *Broker
	Store     *Store
	behaviour map[string]Behaviour
	consumers []*simConsumer
	faults    int
	steps     int
	// What really happened, per message id: handler runs that failed or
	// killed their consumer; runs begun and not ended; and how many runs
	// were live elsewhere when a run of the message began (which the
	// ledger cannot tell from runs that died: see inbox.Record).
	realFailures map[string]int
	live         map[string]int
	overlap      map[string]int
	// unexcused counts the runs a shutdown ended whose excuse the ledger
	// could not write (the database down then): counted as runs that
	// died, as the ledger cannot tell.
	unexcused map[string]int
	// dlFailed marks the messages whose dead letter failed with their
	// record kept: no forget (of any copy) since the dead letter was
	// decided; forgets counts the forgets written per message.
	dlFailed   map[string]bool
	forgets    map[string]int
	violations []string
	trace      []string
}

type simConsumer struct {
	name string
	held []BrokerDelivery // taken ahead
	cur  *simDelivery
	gen  int // restarts
}

type simDelivery struct {
	bd    BrokerDelivery
	core  *inbox.Delivery
	dec   inbox.Decision
	tx    *Tx
	begun bool // its OpBegin is written and its run not ended
	// forgets is the world's count of the message's forgets when the
	// core decided its dead letter.
	forgets int
}

// NewWorld returns the world of seed under cfg.
func NewWorld(seed uint64, cfg WorldConfig) *World {
	cfg.Consumers = max(cfg.Consumers, 1)
	cfg.Prefetch = max(cfg.Prefetch, 1)
	w := &World{cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), Broker: NewBroker(0), Store: NewStore(),
		behaviour: map[string]Behaviour{}, realFailures: map[string]int{}, live: map[string]int{}, overlap: map[string]int{}, unexcused: map[string]int{},
		dlFailed: map[string]bool{}, forgets: map[string]int{}}
	for i := range cfg.Messages {
		id := fmt.Sprintf("m-%03d", i)
		b := Healthy
		switch r := w.rng.IntN(10); {
		case r == 0:
			b = Poison
		case r == 1:
			b = Flaky
		case r == 2:
			b = Killer
		case r == 3:
			b = Hanger
		}
		w.behaviour[id] = b
		w.Broker.Publish(id)
		if cfg.ProducerDuplicates && w.rng.IntN(5) == 0 {
			w.Broker.Publish(id)
		}
	}
	for i := range cfg.Consumers {
		w.consumers = append(w.consumers, &simConsumer{name: fmt.Sprintf("c%d", i)})
	}
	return w
}

// Behaviour returns the behaviour of the message id's handler.
func (w *World) Behaviour(id string) Behaviour { return w.behaviour[id] }

// Trace returns the steps taken, one line each.
func (w *World) Trace() []string { return w.trace }

func (w *World) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%5d %s ", w.steps, w.Broker.Now())+fmt.Sprintf(format, args...))
}

// Run steps until every message is settled (or maxSteps pass) and returns
// the violations of the invariants ([World.Check]).
func (w *World) Run(maxSteps int) []string {
	for w.steps < maxSteps && !w.Broker.Settled() {
		w.Step()
	}
	if !w.Broker.Settled() {
		w.violations = append(w.violations, fmt.Sprintf("not settled after %d steps", maxSteps))
	}
	return w.Check()
}

// Step takes one step: a fault while any are left to draw, or a
// consumer's move, or, when no consumer can move, the time to the next
// due message.
func (w *World) Step() {
	w.steps++
	if w.faults < w.cfg.Faults && w.rng.IntN(8) == 0 {
		w.faults++
		w.fault()
		return
	}
	if w.Store.isDown() && (w.faults >= w.cfg.Faults || w.rng.IntN(3) == 0) {
		w.Store.SetDown(false)
		w.logf("database back")
	}
	order := w.rng.Perm(len(w.consumers))
	for _, i := range order {
		if w.move(w.consumers[i]) {
			return
		}
	}
	if d, ok := w.Broker.NextDue(); ok {
		w.Broker.Advance(d)
		w.logf("time +%v", d)
		return
	}
	// Nothing can move: a transaction waits on another; advance time a
	// little so that the world does not spin.
	w.Broker.Advance(time.Millisecond)
}

func (s *Store) isDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.down
}

// fault draws one fault.
func (w *World) fault() {
	c := w.consumers[w.rng.IntN(len(w.consumers))]
	switch w.rng.IntN(4) {
	case 0:
		w.logf("%s shuts down", c.name)
		w.shutdown(c)
	case 1:
		w.logf("%s crashes", c.name)
		w.crash(c)
	case 2:
		w.logf("%s's deliveries duplicated", c.name)
		w.Broker.Duplicate(c.name)
	case 3:
		w.logf("database down")
		w.Store.SetDown(true)
	}
}

// move makes one move of c, and reports whether it could.
func (w *World) move(c *simConsumer) bool {
	if c.cur == nil {
		if len(c.held) < w.cfg.Prefetch {
			if bd, ok := w.Broker.Deliver(c.name, w.cfg.Prefetch); ok {
				c.held = append(c.held, bd)
				w.logf("%s takes %s (delivery %d)", c.name, bd.ID, bd.Deliveries)
				return true
			}
		}
		if len(c.held) == 0 {
			return false
		}
		bd := c.held[0]
		c.held = c.held[1:]
		d := &simDelivery{bd: bd, core: inbox.NewDelivery(w.cfg.Policy)}
		c.cur = d
		d.dec = d.core.Arrive(inbox.Arrival{HasID: bd.ID != "", MaybeRedelivered: bd.Redelivered()})
		return true
	}
	d := c.cur
	switch {
	case d.dec.Write != inbox.OpNone:
		w.write(d)
		return true
	case d.dec.Verb == inbox.VerbRun:
		return w.run(c, d)
	}
	w.settle(c, d)
	return true
}

// write makes the ledger write d's decision asks for, and keeps the
// world's count of live runs.
func (w *World) write(d *simDelivery) {
	id := d.bd.ID
	op := d.dec.Write
	rec, err := w.Store.Ledger().Apply(context.Background(), inbox.Key{ID: id}, op)
	w.logf("ledger %s %s: %+v %v", op, id, rec, err)
	if err == nil {
		switch op {
		case inbox.OpBegin:
			if !rec.Processed {
				w.overlap[id] += w.live[id]
				w.live[id]++
				d.begun = true
			}
		case inbox.OpFailBegun, inbox.OpExcuse:
			w.end(d)
		case inbox.OpForget:
			w.forgets[id]++
			delete(w.dlFailed, id)
		}
	} else if op == inbox.OpExcuse || op == inbox.OpFailBegun {
		// The run ended, but the ledger still counts it as running.
		if op == inbox.OpExcuse {
			w.unexcused[id]++
		}
		w.end(d)
	}
	d.dec = d.core.Recorded(rec, err)
	if d.dec.Verb == inbox.VerbDeadLetter {
		d.forgets = w.forgets[id]
	}
	if op == inbox.OpBegin && d.core.State() == inbox.StateRunning && w.dlFailed[id] {
		w.violations = append(w.violations, fmt.Sprintf("step %d: %s runs again after its dead letter failed (its count was lost)", w.steps, id))
	}
	if op == inbox.OpBegin && err == nil && !rec.Processed && d.core.State() != inbox.StateRunning {
		// Begun, then not run (dead-lettered on arrival): its forget
		// ends it.
		w.end(d)
	}
}

// end notes that d's begun run ended.
func (w *World) end(d *simDelivery) {
	if d.begun {
		d.begun = false
		w.live[d.bd.ID]--
	}
}

// run takes one step of d's handler.
func (w *World) run(c *simConsumer, d *simDelivery) bool {
	id := d.bd.ID
	switch w.behaviour[id] {
	case Killer:
		w.logf("%s killed by %s", c.name, id)
		w.crash(c)
		return true
	case Hanger:
		// Past the limit: counted, released while it still runs; then it
		// fails.
		w.realFailures[id]++
		d.dec = d.core.LimitPassed()
		for d.dec.Write != inbox.OpNone {
			w.write(d)
		}
		w.end(d)
		if d.dec.Verb == inbox.VerbRelease {
			_ = w.Broker.Requeue(d.bd.Tag, 0)
		}
		d.core.Returned(inbox.Ending{Err: errors.New("hung, then gave up")})
		w.logf("%s: %s hung, released", c.name, id)
		c.cur = nil
		return true
	}
	if d.tx == nil {
		tx, dup, err := w.Store.Begin(inbox.Key{ID: id})
		switch {
		case errors.Is(err, ErrLocked):
			return false // waits for the other transaction
		case err != nil:
			// The database is down: the handler fails (a real failure
			// of its run, as the core cannot tell it from any other).
			w.realFailures[id]++
			d.dec = d.core.Returned(inbox.Ending{Err: err})
			return true
		case dup:
			d.dec = d.core.Returned(inbox.Ending{})
			return true
		}
		d.tx = tx
		return true
	}
	tx := d.tx
	d.tx = nil
	fail := w.behaviour[id] == Poison || (w.behaviour[id] == Flaky && w.realFailures[id] < 2)
	if fail {
		w.realFailures[id]++
		tx.Rollback()
		d.dec = d.core.Returned(inbox.Ending{Err: errors.New("the handler failed")})
		return true
	}
	err := tx.Commit()
	if err != nil {
		w.realFailures[id]++
	}
	if n := w.Store.Effects(id); n > 1 {
		w.violations = append(w.violations, fmt.Sprintf("step %d: %s's effect ran %d times", w.steps, id, n))
	}
	d.dec = d.core.Returned(inbox.Ending{Err: err})
	return true
}

// errDeadLetterFault is a dead letter's failure, drawn when
// WorldConfig.DeadLetterFaults is set.
var errDeadLetterFault = errors.New("the dead letter failed (a fault)")

// settle maps d's final decision onto the broker.
func (w *World) settle(c *simConsumer, d *simDelivery) {
	c.cur = nil
	w.end(d) // an ack or a dead letter after its forget (whatever it answered)
	tag, id := d.bd.Tag, d.bd.ID
	switch d.dec.Verb {
	case inbox.VerbAck:
		_ = w.Broker.Ack(tag)
		w.logf("%s acks %s", c.name, id)
	case inbox.VerbRequeue:
		_ = w.Broker.Requeue(tag, d.dec.Delay)
		w.logf("%s requeues %s after %v (%s)", c.name, id, d.dec.Delay, d.core.State())
	case inbox.VerbDeadLetter:
		var err error
		if w.cfg.DeadLetterFaults && w.rng.IntN(3) == 0 {
			err = errDeadLetterFault
		} else {
			err = w.Broker.DeadLetter(tag)
		}
		dec := d.dec
		d.dec = d.core.DeadLettered(err)
		if err != nil {
			w.logf("%s dead-letters %s: %v", c.name, id, err)
			if id != "" && d.forgets == w.forgets[id] {
				// No copy forgot it meanwhile: its record is kept.
				w.dlFailed[id] = true
			}
			if d.dec.Write == inbox.OpNone {
				w.settle(c, d) // back after the core's delay
			}
			return
		}
		if d.dec.Write != inbox.OpNone {
			c.cur = d // its forget comes next
		}
		w.logf("%s dead-letters %s (%d failed runs counted)", c.name, id, dec.Failures)
		// The ledger counts the runs begun and not ended as runs that
		// died; a run live elsewhere at that moment is counted too (a
		// copy delivered twice at once), and so is a shutdown whose
		// excuse could not be written: allowed for, nothing more.
		limit, limited := w.cfg.Policy.Retry.Limit()
		if id != "" && (!limited || w.realFailures[id]+w.overlap[id]+w.unexcused[id] < limit) {
			w.violations = append(w.violations, fmt.Sprintf("step %d: %s (%s) dead-lettered after %d real failures (%d overlapping runs, %d unexcused shutdowns), the limit is %d",
				w.steps, id, w.behaviour[id], w.realFailures[id], w.overlap[id], w.unexcused[id], limit))
		}
	case inbox.VerbStop:
		_ = w.Broker.Requeue(tag, 0)
	case inbox.VerbNone:
		if s := d.core.State(); s != inbox.StateReleased && s != inbox.StateDeadLettered {
			w.violations = append(w.violations, fmt.Sprintf("step %d: %s: no decision in %s: %v", w.steps, id, d.core.State(), d.dec.Err))
			_ = w.Broker.Requeue(tag, 0)
		}
	}
}

// shutdown stops c gracefully: the handler in progress ends with the
// shutdown's error (its transaction rolled back), everything held goes
// back through the core, and c starts again.
func (w *World) shutdown(c *simConsumer) {
	if d := c.cur; d != nil {
		if d.dec.Verb == inbox.VerbRun {
			if d.tx != nil {
				d.tx.Rollback()
				d.tx = nil
			}
			d.dec = d.core.Returned(inbox.Ending{Err: context.Canceled, Stopping: !w.cfg.CountShutdowns})
		}
		for d.dec.Write != inbox.OpNone {
			w.write(d)
			if d.dec.Verb == inbox.VerbRun {
				// Its marker was written: the Runner runs the handler,
				// which returns at once with the shutdown's error.
				d.dec = d.core.Returned(inbox.Ending{Err: context.Canceled, Stopping: !w.cfg.CountShutdowns})
			}
		}
		w.settle(c, d)
	}
	for _, bd := range c.held {
		core := inbox.NewDelivery(w.cfg.Policy)
		dec := core.Arrive(inbox.Arrival{HasID: bd.ID != "", Stopping: true, MaybeRedelivered: bd.Redelivered()})
		w.settle(c, &simDelivery{bd: bd, core: core, dec: dec})
	}
	c.held = nil
	c.gen++
}

// crash kills c's process: its transaction rolls back, the broker returns
// everything it held, and it starts again with nothing.
func (w *World) crash(c *simConsumer) {
	if d := c.cur; d != nil {
		if d.tx != nil {
			d.tx.Rollback()
		}
		if d.begun || d.dec.Verb == inbox.VerbRun {
			// A run the process died in: a failed run of the message,
			// whatever its cause (the ledger cannot tell either). Its
			// marker stays, counted by the ledger from now on.
			w.realFailures[d.bd.ID]++
			if d.begun {
				d.begun = false
				w.live[d.bd.ID]--
			}
		}
	}
	c.cur = nil
	c.held = nil
	w.Broker.Crash(c.name)
	c.gen++
}

// Check returns the violations of the invariants so far, and, once the
// broker is settled, of those about the end.
func (w *World) Check() []string {
	v := w.violations
	if !w.Broker.Settled() {
		return v
	}
	dead := map[string]bool{}
	for _, id := range w.Broker.DeadLettered() {
		dead[id] = true
	}
	ids := make([]string, 0, len(w.behaviour))
	for id := range w.behaviour {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		n := w.Store.Effects(id)
		switch {
		case n > 1:
			v = append(v, fmt.Sprintf("%s's effect ran %d times", id, n))
		case n == 0 && !dead[id]:
			v = append(v, fmt.Sprintf("%s (%s) was dropped: no effect, not dead-lettered", id, w.behaviour[id]))
		}
	}
	return v
}
