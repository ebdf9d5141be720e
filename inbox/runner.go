package inbox

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
)

// DefaultLedgerTimeout bounds a ledger write a [Runner] makes once the
// handler ran or hangs: the count of a failure, of a shutdown or of a
// processing limit is worth finishing when a shutdown comes meanwhile,
// not worth waiting for without end.
const DefaultLedgerTimeout = 10 * time.Second

// Runner is the shell around the message core that every broker adapter
// runs its deliveries through: for each delivery it asks the core
// ([Delivery]), makes the [Ledger] writes the core asks for, runs the
// handler under its processing limit ([Supervise]) when told, and returns
// the core's final [Decision]. The adapter maps that decision onto its
// broker's verbs and keeps no rule of its own.
//
// A Runner is configured once per adapter Run and then only read: Deliver
// may be called from several goroutines at once, for different
// deliveries. It must not be copied after first use.
type Runner struct {
	// Policy is the core's policy: [Retry], and what becomes of messages
	// without an id.
	Policy Policy
	// Ledger is the record of the messages' handler runs; nil means a
	// [MemoryLedger] of the Runner's own.
	Ledger Ledger
	// Handler processes each message.
	Handler Handler
	// Limit is the processing limit of one handler run; zero or negative
	// means none.
	Limit time.Duration
	// Every is the interval of Hooks.Beat; zero or negative means none.
	Every time.Duration
	// LedgerTimeout bounds each ledger write made after the handler ran
	// or at its processing limit, which a shutdown does not cancel; zero
	// means [DefaultLedgerTimeout].
	LedgerTimeout time.Duration

	once sync.Once
	own  MemoryLedger
}

// Hooks are the broker's verbs a [Runner] calls while a handler runs.
type Hooks struct {
	// Beat, when set, is called every [Runner.Every] while the handler
	// runs (a NATS AckProgress, an SQS visibility extension).
	Beat func()
	// Release, when set, is called once if the processing limit passes
	// while the handler runs, after the failure is counted: it hands the
	// message back at once (VerbRelease). The handler may still run.
	Release func()
}

// Deliver runs one delivery of m through the core, whose arrival evidence
// is a, with k the message's key in the ledger, and returns the final
// decision: VerbAck, VerbRequeue, VerbDeadLetter (then tell the core how
// it went with [Runner.DeadLettered]), VerbStop, or VerbNone when the
// message was released at the processing limit (the delivery is spent). The handler gets a context that ends with ctx or at the limit.
// The core's state after the call is in the returned Delivery.
func (r *Runner) Deliver(ctx context.Context, m *Message, k Key, a Arrival, hooks Hooks) (Decision, *Delivery) {
	r.once.Do(func() {
		if r.Ledger == nil {
			r.Ledger = &r.own
		}
	})
	if plant.NoBeat { // a planted bug (internal/plant), false but in a test build
		hooks.Beat = nil
	}
	d := NewDelivery(r.Policy)
	dec := r.apply(ctx, d, k, d.Arrive(a))
	if dec.Verb != VerbRun {
		return dec, d
	}
	released, err := Supervise(ctx, r.Handler, m, Supervision{
		Limit: r.Limit,
		Every: r.Every,
		Beat:  hooks.Beat,
		Release: func() {
			rel := r.apply(ctx, d, k, d.LimitPassed())
			if rel.Verb == VerbRelease && hooks.Release != nil {
				hooks.Release()
			}
		},
	})
	if released {
		return d.Returned(Ending{Err: err}), d
	}
	return r.apply(ctx, d, k, d.Returned(Ending{Err: err, Stopping: ctx.Err() != nil})), d
}

// DeadLettered tells the core of d, whose final decision from
// [Runner.Deliver] was VerbDeadLetter, how the adapter's dead letter went
// (err nil: the message is in the dead-letter destination), makes the
// ledger write that follows, and returns the decision that settles d.
// Only once the dead letter is done is the message's record forgotten
// (OpForget, in a context a shutdown does not cancel); the decision then
// is VerbNone, in [StateDeadLettered]. When err is not nil, the record
// stays with its count and the decision is VerbRequeue after the delay
// of its failed runs ([StateDeadLetterFailed]): delivered again, the
// message is dead-lettered on arrival, without running. An adapter that
// never calls it (a crash before the dead letter) costs the same: one
// more attempt to dead-letter it, never a run.
func (r *Runner) DeadLettered(ctx context.Context, d *Delivery, k Key, err error) Decision {
	return r.apply(ctx, d, k, d.DeadLettered(err))
}

// apply makes the writes dec asks for, one after the other, and returns
// the first decision without one.
func (r *Runner) apply(ctx context.Context, d *Delivery, k Key, dec Decision) Decision {
	for dec.Write != OpNone {
		wctx, cancel := r.writeContext(ctx, dec.Write)
		rec, err := r.Ledger.Apply(wctx, k, dec.Write)
		cancel()
		dec = d.Recorded(rec, err)
	}
	return dec
}

// writeContext is the context of a write of op. OpBegin, before the
// handler runs, ends with ctx: a shutdown then hands the message back
// unrun. Every write after a run (its count, its excuse, its record
// forgotten) is worth finishing even when a shutdown comes meanwhile: a
// context of its own, bounded by LedgerTimeout.
func (r *Runner) writeContext(ctx context.Context, op Op) (context.Context, context.CancelFunc) {
	if op == OpBegin {
		return ctx, func() {}
	}
	t := r.LedgerTimeout
	if t <= 0 {
		t = DefaultLedgerTimeout
	}
	return context.WithTimeout(context.WithoutCancel(ctx), t)
}
