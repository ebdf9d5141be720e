package inbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
)

// The message core decides what becomes of one delivery of a message:
// run its handler, ack it, hand it back for a redelivery (at once or after
// a delay), or dead-letter it. It decides from evidence only (what the
// adapter saw on arrival, what the [Ledger] answered, how the handler
// ended) and from the inbox's own durable record of the message's handler
// runs, never from a broker's delivery counter: quorum queues, JetStream
// and SQS count every delivery, including those a shutdown, a prefetch
// handed back or a neighbour's processing limit returned, which say
// nothing about the message.
//
// The core holds no driver, clock or goroutine. A shell ([Runner], or the
// simulator's loop) makes the ledger write each [Decision] asks for,
// reports its answer with [Delivery.Recorded], runs the handler when told,
// and finally maps the decision's [Verb] onto its broker's verbs; after a
// dead letter it says how that went ([Delivery.DeadLettered]), and only
// then is the message's record forgotten.
// docs/consumer.md draws the states and their transitions.

// State is where one delivery stands in the message core.
type State uint8

const (
	// StateReceived: the adapter holds the delivery; nothing is decided.
	StateReceived State = iota
	// StateChecking: the run's durable marker is being written (OpBegin),
	// whose answer says whether the message is done, exhausted or to run.
	StateChecking
	// StateRunning: the handler runs.
	StateRunning
	// StateFailing: the handler failed; the failure is being counted,
	// unless the ledger's answer says the message is processed.
	StateFailing
	// StateReleasing: the handler passed its processing limit; the
	// failure is being counted, then the message goes back at once.
	StateReleasing
	// StateClosing: the ledger's record is being closed (OpForget,
	// OpExcuse) before the final verb, which does not depend on it; or,
	// after a dead letter the shell reported done, before the delivery
	// settles as dead-lettered.
	StateClosing
	// StateDeadLettering: the core decided VerbDeadLetter; the shell gives
	// the message to the dead-letter destination and reports how that
	// went ([Delivery.DeadLettered]). The message's ledger record, with
	// its count, is kept until the dead letter is done: a dead letter
	// that fails (or a crash before it) leaves a message that comes back
	// exhausted and is dead-lettered on arrival, without running again.
	StateDeadLettering
	// StateTombstoning: the core decided to dead-letter the message; its
	// tombstone is being written (OpTombstone): the inbox marks its id
	// dead-lettered, in a transaction that conflicts with the effect's,
	// so that of a dead letter and an effect of one message only one
	// commits. Its answer says the effect won (the message is acked), or
	// the dead letter goes ahead.
	StateTombstoning

	// StateAcked (final): settled as done. The effect committed, or the
	// message was a duplicate.
	StateAcked
	// StateRetrying (final): handed back for a redelivery after a delay,
	// after a counted failure.
	StateRetrying
	// StateDeferred (final): handed back after a delay without counting
	// anything: the ledger could not be read or written.
	StateDeferred
	// StateHandedBack (final): handed back at once, uncounted: a
	// shutdown, or a delivery taken ahead and never run.
	StateHandedBack
	// StateReleased (final): handed back at once while the handler still
	// ran past its processing limit; the failure is counted.
	StateReleased
	// StateDeadLettered (final): given to the broker's dead-letter
	// destination: its handler failed as often as allowed, or it has no
	// id and the policy says so.
	StateDeadLettered
	// StateStopped (final): no id, and the policy stops the consumer; the
	// message is handed back.
	StateStopped
	// StateDeadLetterFailed (final): the dead letter failed (the shell
	// said so); the message is handed back after a delay, its ledger
	// record kept, so that it is dead-lettered on its next arrival
	// without running.
	StateDeadLetterFailed

	stateCount = iota
)

var stateNames = [stateCount]string{"received", "checking", "running", "failing", "releasing", "closing", "dead-lettering", "tombstoning",
	"acked", "retrying", "deferred", "handed-back", "released", "dead-lettered", "stopped", "dead-letter-failed"}

// String returns the state's name, as docs/consumer.md spells it.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// Final reports whether s is a final state: the delivery is settled, or
// handed to the broker to settle.
func (s State) Final() bool { return s >= StateAcked }

// moves is the core's table: the only moves it makes. A move it is asked
// to make that is not here is refused (see [Delivery]): an ack after a
// failure, a dead letter after a shutdown, anything out of a final state.
var moves = [stateCount][]State{
	StateReceived:      {StateChecking, StateRunning, StateHandedBack, StateDeadLettering, StateStopped},
	StateChecking:      {StateRunning, StateAcked, StateDeadLettering, StateDeferred, StateTombstoning},
	StateRunning:       {StateAcked, StateClosing, StateHandedBack, StateFailing, StateReleasing},
	StateFailing:       {StateRetrying, StateClosing, StateDeadLettering, StateDeferred, StateTombstoning},
	StateTombstoning:   {StateDeadLettering, StateClosing, StateDeferred},
	StateReleasing:     {StateReleased},
	StateDeadLettering: {StateClosing, StateDeadLettered, StateDeadLetterFailed},
	StateClosing:       {StateAcked, StateHandedBack, StateDeadLettered},
}

// coreBug, when set (by tests), is told of every move the table refused:
// each is a bug in a shell.
var coreBug func(from, to State)

// Op is a write to the [Ledger].
type Op uint8

const (
	// OpNone: nothing to write.
	OpNone Op = iota
	// OpBegin: a handler run starts. The ledger adds one to Running,
	// durably, before the handler runs, so that a run the process dies
	// in is counted; its answer is the record as it was before. When the
	// message is already processed, it writes nothing and says so.
	OpBegin
	// OpFail: a run that had no OpBegin failed: Failures + 1. When the
	// message is processed (its effect committed, though the handler
	// failed: a commit whose answer was lost), it writes nothing and says
	// so, as OpBegin does.
	OpFail
	// OpFailBegun: a run that had an OpBegin failed: Failures + 1 and
	// Running - 1. The answer is the record after it. When the message is
	// processed, it writes nothing and says so, as OpFail does.
	OpFailBegun
	// OpExcuse: a run that had an OpBegin ended without counting (a
	// shutdown): Running - 1.
	OpExcuse
	// OpForget: the message is settled for good (done, or dead-lettered
	// and the shell said the dead letter is done): its record goes. A
	// tombstone (OpTombstone) stays.
	OpForget
	// OpTombstone: the message is to be dead-lettered. The ledger marks
	// its id dead-lettered in the inbox (a tombstone), in a write that
	// conflicts with the effect's transaction on the inbox's row of the
	// id: of the two, the first to commit wins. When the effect committed
	// first, it writes nothing and answers Record{Processed: true} (the
	// core acks); otherwise the answer says DeadLettered, with the
	// record's counts. An effect's transaction that meets the tombstone
	// runs nothing and fails with [ErrDeadLettered], and the answers to
	// OpBegin, OpFail and OpFailBegun say DeadLettered (and write
	// nothing) until the tombstone is cleared ([SQLLedger.Redrive]) or
	// pruned. A ledger that sees no inbox ([MemoryLedger]) writes nothing
	// and answers the record.
	OpTombstone
)

var opNames = [...]string{"none", "begin", "fail", "fail-begun", "excuse", "forget", "tombstone"}

// String returns the write's name.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", o)
}

// Verb is what a shell tells its broker.
type Verb uint8

const (
	// VerbNone: nothing (a ledger write comes first, or the message is
	// already settled: released at the processing limit).
	VerbNone Verb = iota
	// VerbRun: run the handler, then report how it ended
	// ([Delivery.Returned]).
	VerbRun
	// VerbAck: settle the message as done (ack, delete, commit the
	// offset).
	VerbAck
	// VerbRequeue: hand the message back, to be delivered again after
	// [Decision.Delay] (zero: at once).
	VerbRequeue
	// VerbRelease: hand the message back at once while its handler still
	// runs past the processing limit (a nack, a nak, a visibility of
	// zero). After it, the delivery is spent: never ack it.
	VerbRelease
	// VerbDeadLetter: give the message to the broker's dead-letter
	// destination, report it when [Decision.Report] says so, and tell
	// the core how the dead letter went ([Runner.DeadLettered]): its
	// ledger record goes only once it is done.
	VerbDeadLetter
	// VerbStop: hand the message back and stop the consumer with
	// [Decision.Err].
	VerbStop
)

var verbNames = [...]string{"none", "run", "ack", "requeue", "release", "dead-letter", "stop"}

// String returns the verb's name.
func (v Verb) String() string {
	if int(v) < len(verbNames) {
		return verbNames[v]
	}
	return fmt.Sprintf("Verb(%d)", v)
}

// Decision is what the core decided for a delivery.
type Decision struct {
	// Write is the ledger write to make first; its answer goes to
	// [Delivery.Recorded], which decides again. OpNone: act on Verb.
	Write Op
	// Verb is what to tell the broker once Write is OpNone.
	Verb Verb
	// Delay is how long a requeued message stays away (VerbRequeue).
	Delay time.Duration
	// Err says why: the handler's error of a counted failure, or why the
	// message is dead-lettered or the consumer stops. Nil otherwise.
	Err error
	// Failures is how many of the message's handler runs failed, by the
	// ledger (failures and runs the process died in), when known.
	Failures int
	// Report says the message is to be reported ([ReportDeadLetter]):
	// dead-lettered, or, with no limit, holding up its queue.
	Report bool
}

// NoID says what becomes of a message without an id.
type NoID uint8

const (
	// NoIDDeadLetter (the zero value): to the dead-letter destination,
	// reported.
	NoIDDeadLetter NoID = iota
	// NoIDStop: handed back, and the consumer stops with an error.
	NoIDStop
)

// Policy is what the core needs of an adapter's settings. The zero value
// is [Retry]'s default and dead-letters messages without an id.
type Policy struct {
	// Retry says how long a failed message stays away and after how many
	// failed runs it is dead-lettered.
	Retry Retry
	// NoID says what becomes of a message without an id.
	NoID NoID
}

// Arrival is the evidence a shell has when a delivery arrives.
type Arrival struct {
	// HasID is true when the message has an id (or a key the ledger can
	// record it under).
	HasID bool
	// Stopping is true when the consumer is shutting down: the delivery
	// was taken ahead of the handler (a prefetch, a batch) and goes back
	// unrun and uncounted.
	Stopping bool
	// MaybeRedelivered is true when the broker may have delivered the
	// message before (a redelivered flag, a delivery count above one, a
	// Kafka record read again after a restart or a seek). It decides only
	// whether the run is worth a durable marker (OpBegin) before the
	// handler runs, never what becomes of the message: a run the process
	// dies in is counted only when it had one, so a message that kills
	// its consumer on its first delivery is counted from its second.
	MaybeRedelivered bool
}

// Ending is how a handler run ended.
type Ending struct {
	// Err is the handler's error; nil when it succeeded (its effect
	// committed).
	Err error
	// Stopping is true when the consumer was shutting down as the handler
	// returned: an error then is the shutdown's, never counted.
	Stopping bool
}

// Record is what a [Ledger] durably knows of one message.
type Record struct {
	// Processed is true when the inbox holds the message's id: its effect
	// committed. The answers to OpBegin, OpFail and OpFailBegun say it
	// (and then nothing was written); a ledger that cannot tell
	// ([MemoryLedger]) says false.
	Processed bool
	// Failures counts the handler runs that failed: returned an error, or
	// passed the processing limit.
	Failures int
	// Running counts the handler runs begun (OpBegin) and not ended: runs
	// the process died in, unless one is live elsewhere at this moment.
	Running int
	// DeadLettered is true when the inbox holds the message's tombstone
	// (OpTombstone): it was dead-lettered, or is being, and its effect
	// can no longer commit. The answers to OpBegin, OpFail and
	// OpFailBegun say it (and then nothing was written): the core
	// dead-letters the delivery, unrun and uncounted (at least one copy
	// must land: the first one's answer may have been lost).
	DeadLettered bool
}

// failed is how many of the message's runs failed, by r: counted
// failures and the runs the process died in.
func (r Record) failed() int { return max(r.Failures, 0) + max(r.Running, 0) }

// ErrExhausted: a message arrived whose handler runs had already failed
// as often as [Retry] allows (some of them, typically, by killing their
// process): it is dead-lettered without running again.
var ErrExhausted = errors.New("inbox: the message's handler failed as often as allowed")

// ErrDeadLettered: the message was dead-lettered (the inbox holds its
// tombstone, see [OpTombstone]): an inbox's Handle runs nothing for it,
// and the core dead-letters the delivery again, unrun. An operator who
// redrives dead letters clears their tombstones first
// ([SQLLedger.Redrive]); a tombstone also goes when the inbox prunes it.
var ErrDeadLettered = errors.New("inbox: the message was dead-lettered (its tombstone is in the inbox)")

// errRefused is a [Decision]'s Err for a move the core refused.
var errRefused = errors.New("inbox: the message core refused a move (a bug in the adapter)")

// Delivery is the message core's state for one delivery of a message: a
// state machine whose methods take evidence and return the next
// [Decision]. Begin with [NewDelivery] and [Delivery.Arrive]; after a
// decision with a Write, call [Delivery.Recorded] with the ledger's
// answer; after VerbRun, [Delivery.LimitPassed] if the processing limit
// passes first, then [Delivery.Returned]. A call the current state does
// not expect is refused: the state stays, and the decision is VerbNone
// with an error (a shell that keeps the message unsettled then, for the
// broker to redeliver, is safe).
//
// A Delivery is a value of a few words; it is not safe for concurrent
// use.
type Delivery struct {
	policy  Policy
	state   State
	began   bool   // an OpBegin is durable for this run
	rec     Record // the ledger's last answer
	cause   error  // the handler's error, or why it is dead-lettered
	pending Op     // the write whose answer Recorded awaits
	then    Decision
	thenSt  State // where StateClosing ends, with then
	forget  bool  // StateDeadLettering: the message has a ledger record
	refused []Move
}

// Move is a transition the core was asked to make: from the state it
// was in, to the state the call would have led to.
type Move struct{ From, To State }

// NewDelivery returns the core of a delivery that has just arrived, under
// p.
func NewDelivery(p Policy) *Delivery { return &Delivery{policy: p} }

// State returns where the delivery stands.
func (d *Delivery) State() State { return d.state }

// Refused returns the moves the core refused, in order (none in a
// correct shell).
func (d *Delivery) Refused() []Move { return d.refused }

// advance moves d to to if the table allows it, and reports whether it
// did.
func (d *Delivery) advance(to State) bool {
	for _, s := range moves[d.state] {
		if s == to {
			d.state = to
			return true
		}
	}
	d.refused = append(d.refused, Move{d.state, to})
	if f := coreBug; f != nil {
		f(d.state, to)
	}
	return false
}

// refuse records a call the state does not expect, as a refused move to
// want, and decides nothing.
func (d *Delivery) refuse(want State) Decision {
	d.refused = append(d.refused, Move{d.state, want})
	if f := coreBug; f != nil {
		f(d.state, want)
	}
	return Decision{Err: fmt.Errorf("%w: %s -> %s", errRefused, d.state, want)}
}

// write moves d to s, where it waits for the answer to op.
func (d *Delivery) write(s State, op Op) Decision {
	if !d.advance(s) {
		return Decision{Err: errRefused}
	}
	d.pending = op
	return Decision{Write: op}
}

// settle moves d to the final state s with decision dec.
func (d *Delivery) settle(s State, dec Decision) Decision {
	if !d.advance(s) {
		return Decision{Err: errRefused}
	}
	return dec
}

// closeThen writes op (OpForget or OpExcuse) and then, whatever the
// ledger answers, settles in s with dec: a record left behind costs a
// count, never an effect (the inbox's own row says the message is done;
// a dead-lettered message's record makes a redrive of its id
// dead-lettered at once, until the record is pruned or forgotten).
func (d *Delivery) closeThen(op Op, s State, dec Decision) Decision {
	if !d.advance(StateClosing) {
		return Decision{Err: errRefused}
	}
	d.pending = op
	d.then = dec
	d.then.Write = OpNone
	switch s {
	case StateAcked, StateHandedBack, StateDeadLettered:
	default:
		panic("inbox: closeThen to " + s.String())
	}
	d.thenSt = s
	return Decision{Write: op}
}

// Arrive decides what to do with a delivery that has just arrived.
func (d *Delivery) Arrive(a Arrival) Decision {
	if d.state != StateReceived || d.pending != OpNone {
		return d.refuse(StateRunning)
	}
	switch {
	case a.Stopping:
		return d.settle(StateHandedBack, Decision{Verb: VerbRequeue})
	case !a.HasID && d.policy.NoID == NoIDStop:
		return d.settle(StateStopped, Decision{Verb: VerbStop, Err: ErrNoMessageID})
	case !a.HasID:
		return d.deadLetter(false, Decision{Verb: VerbDeadLetter, Err: ErrNoMessageID, Report: true})
	case a.MaybeRedelivered:
		return d.write(StateChecking, OpBegin)
	}
	return d.settle(StateRunning, Decision{Verb: VerbRun})
}

// Recorded takes the ledger's answer to the decision's Write and decides
// again.
func (d *Delivery) Recorded(rec Record, err error) Decision {
	op := d.pending
	if op == OpNone {
		return d.refuse(StateRunning)
	}
	d.pending = OpNone
	if err == nil {
		d.rec = rec
	}
	switch d.state {
	case StateChecking:
		switch {
		case err != nil:
			// Nothing known: not run without its marker, not counted.
			return d.settle(StateDeferred, Decision{Verb: VerbRequeue, Delay: d.policy.Retry.After(1)})
		case rec.Processed:
			// Done before (the inbox holds its id); OpBegin wrote nothing.
			return d.settle(StateAcked, Decision{Verb: VerbAck})
		case rec.DeadLettered:
			// Dead-lettered before (its tombstone is in the inbox); OpBegin
			// wrote nothing. Again, unrun: that dead letter's answer may
			// have been lost, and this is the copy that must land.
			return d.deadLetter(true, Decision{Verb: VerbDeadLetter, Err: ErrDeadLettered, Failures: rec.failed(), Report: true})
		case d.exhausted(rec.failed()):
			// Its runs failed as often as allowed already, some by
			// killing their process: not run again.
			d.began = true
			return d.tombstone(Decision{Verb: VerbDeadLetter,
				Err: fmt.Errorf("%w: %d failed runs", ErrExhausted, rec.failed()), Failures: rec.failed(), Report: true})
		}
		d.began = true
		return d.settle(StateRunning, Decision{Verb: VerbRun})
	case StateFailing:
		if err != nil {
			// The failure could not be counted: back after the delay it
			// would have had, uncounted.
			return d.settle(StateDeferred, Decision{Verb: VerbRequeue, Delay: d.policy.Retry.After(d.rec.failed() + 1), Err: d.cause})
		}
		if rec.Processed {
			// The handler failed, yet its effect committed: a commit
			// whose answer was lost ("outcome unknown"), or another
			// delivery of the message that committed meanwhile. Done:
			// acked and forgotten, never requeued or dead-lettered (a
			// dead letter replayed would run the effect again).
			return d.closeThen(OpForget, StateAcked, Decision{Verb: VerbAck})
		}
		if rec.DeadLettered {
			// Another delivery dead-lettered the message while this one
			// ran (its effect's transaction met the tombstone): nothing
			// was counted; dead-lettered again, as on arrival.
			return d.deadLetter(true, Decision{Verb: VerbDeadLetter, Err: ErrDeadLettered, Failures: rec.failed(), Report: true})
		}
		n := rec.failed()
		if d.exhausted(n) {
			return d.tombstone(Decision{Verb: VerbDeadLetter, Err: d.cause, Failures: n, Report: true})
		}
		_, limited := d.policy.Retry.Limit()
		return d.settle(StateRetrying, Decision{Verb: VerbRequeue, Delay: d.policy.Retry.After(max(n, 1)), Err: d.cause,
			Failures: n, Report: !limited && n >= DefaultMaxDeliveries})
	case StateReleasing:
		// Counted, or not when the ledger failed or the message is
		// processed (its redelivery then is a duplicate, acked): back at
		// once either way, so that another consumer gets it. Not acked
		// here: the handler still runs.
		n := 0
		if err == nil {
			n = rec.failed()
		}
		return d.settle(StateReleased, Decision{Verb: VerbRelease, Failures: n, Err: d.cause})
	case StateTombstoning:
		dec := d.then
		d.then = Decision{}
		switch {
		case err != nil:
			// Unknown whether the tombstone is there: back after the
			// delay, uncounted; if it is, the next delivery is
			// dead-lettered on arrival.
			return d.settle(StateDeferred, Decision{Verb: VerbRequeue, Delay: d.policy.Retry.After(max(dec.Failures, 1)), Err: dec.Err,
				Failures: dec.Failures})
		case rec.Processed:
			// The effect committed first (a run live elsewhere, or one
			// whose commit's answer was lost): done, never dead-lettered.
			return d.closeThen(OpForget, StateAcked, Decision{Verb: VerbAck})
		}
		return d.deadLetter(true, dec)
	case StateClosing:
		dec := d.then
		d.then = Decision{}
		return d.settle(d.thenSt, dec)
	}
	return d.refuse(StateRunning)
}

// tombstone moves d to StateTombstoning, where the message's tombstone is
// written (OpTombstone) before the dead letter dec.
func (d *Delivery) tombstone(dec Decision) Decision {
	if !d.advance(StateTombstoning) {
		return Decision{Err: errRefused}
	}
	d.pending = OpTombstone
	d.then = dec
	return Decision{Write: OpTombstone}
}

// deadLetter moves d to StateDeadLettering with dec (VerbDeadLetter),
// where it waits for the shell's [Delivery.DeadLettered]. Nothing is
// forgotten yet: a dead letter can fail (a produce, a reject on a channel
// that just closed, a term), and a message whose record went before it
// would come back and run again from a count of zero.
func (d *Delivery) deadLetter(forget bool, dec Decision) Decision {
	if !d.advance(StateDeadLettering) {
		return Decision{Err: errRefused}
	}
	d.forget = forget
	return dec
}

// DeadLettered tells the core how the shell's dead letter (VerbDeadLetter)
// went: err nil when the message is in the dead-letter destination. Then
// its ledger record is forgotten (OpForget, whatever the ledger answers),
// and the delivery settles as [StateDeadLettered] with nothing more to
// do. When err is not nil, the record stays with its count, and the
// delivery settles as [StateDeadLetterFailed]: VerbRequeue after the
// delay of its failed runs, so that it comes back exhausted and is
// dead-lettered on arrival, unrun (a shell whose broker hands it back on
// its own, a channel that closed, may leave it to the broker).
func (d *Delivery) DeadLettered(err error) Decision {
	if d.state != StateDeadLettering || d.pending != OpNone {
		return d.refuse(StateDeadLettered)
	}
	if err != nil && !plant.ForgetDeadLetter { // a planted bug (internal/plant), false but in a test build
		n := 0
		if d.forget {
			n = d.rec.failed()
		}
		return d.settle(StateDeadLetterFailed, Decision{Verb: VerbRequeue, Delay: d.policy.Retry.After(max(n, 1)),
			Err: fmt.Errorf("inbox: dead letter: %w", err), Failures: n})
	}
	if !d.forget {
		// No id: no record to forget.
		return d.settle(StateDeadLettered, Decision{})
	}
	return d.closeThen(OpForget, StateDeadLettered, Decision{})
}

// exhausted reports whether n failed runs are as many as the policy
// allows.
func (d *Delivery) exhausted(n int) bool { return d.policy.Retry.Exhausted(n) }

// LimitPassed tells the core that the handler passed its processing limit
// and still runs: the failure is counted, then the message goes back at
// once (VerbRelease) so that another consumer gets it.
func (d *Delivery) LimitPassed() Decision {
	if d.state != StateRunning {
		return d.refuse(StateReleasing)
	}
	d.cause = errLimit
	op := OpFail
	if d.began {
		op = OpFailBegun
	}
	return d.write(StateReleasing, op)
}

// errLimit is the cause of a failure by the processing limit.
var errLimit = errors.New("inbox: the handler passed its processing limit")

// Returned tells the core how the handler run ended.
func (d *Delivery) Returned(e Ending) Decision {
	switch d.state {
	case StateReleased:
		// Handed back at the limit already: the delivery is spent,
		// whatever the handler did (its effect, if it committed, makes
		// the redelivery a duplicate).
		return Decision{}
	case StateRunning:
	default:
		return d.refuse(StateAcked)
	}
	switch {
	case e.Err == nil:
		if d.began {
			return d.closeThen(OpForget, StateAcked, Decision{Verb: VerbAck})
		}
		return d.settle(StateAcked, Decision{Verb: VerbAck})
	case e.Stopping && !plant.CountShutdowns: // a planted bug (internal/plant), false but in a test build
		// The shutdown's error, or one it may have caused: never
		// counted, back at once.
		if d.began {
			return d.closeThen(OpExcuse, StateHandedBack, Decision{Verb: VerbRequeue})
		}
		return d.settle(StateHandedBack, Decision{Verb: VerbRequeue})
	}
	d.cause = e.Err
	op := OpFail
	if d.began {
		op = OpFailBegun
	}
	return d.write(StateFailing, op)
}
