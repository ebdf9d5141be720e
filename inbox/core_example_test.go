package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idemhttp/inbox"
)

// The message core by hand, as a shell (an adapter, the simulator)
// drives it: evidence in, decisions out. A redelivered message arrives;
// the core asks for a marker in the ledger, then for the run; the handler
// fails, the core asks for the failure to be counted and decides the
// delay.
func ExampleDelivery() {
	ctx := context.Background()
	ledger := &inbox.MemoryLedger{}
	k := inbox.Key{IDSpace: "orders", ID: "order-42"}
	d := inbox.NewDelivery(inbox.Policy{Retry: inbox.Retry{Delay: time.Second, MaxDeliveries: 3}})
	dec := d.Arrive(inbox.Arrival{HasID: true, MaybeRedelivered: true})
	for dec.Write != inbox.OpNone {
		fmt.Println("write", dec.Write)
		rec, err := ledger.Apply(ctx, k, dec.Write)
		dec = d.Recorded(rec, err)
	}
	fmt.Println(d.State(), dec.Verb)
	dec = d.Returned(inbox.Ending{Err: errors.New("the payment API said 503")})
	for dec.Write != inbox.OpNone {
		fmt.Println("write", dec.Write)
		rec, err := ledger.Apply(ctx, k, dec.Write)
		dec = d.Recorded(rec, err)
	}
	fmt.Println(d.State(), dec.Verb, dec.Delay, dec.Failures)
	// Output:
	// write begin
	// running run
	// write fail-begun
	// retrying requeue 1s 1
}

// The shell every adapter runs its deliveries through: a shutdown while
// the handler runs hands the message back at once and counts nothing;
// the handler's own failures are counted, and the last allowed one
// dead-letters the message. The adapter tells the core how its dead
// letter went: the message's record goes only once it is done.
func ExampleRunner() {
	ledger := &inbox.MemoryLedger{} // in production, the inbox's: inbox.SQL.Ledger
	r := &inbox.Runner{Policy: inbox.Policy{Retry: inbox.Retry{MaxDeliveries: 2}}, Ledger: ledger}
	m := &inbox.Message{ID: "order-42", IDSpace: "orders"}
	k := inbox.Key{IDSpace: m.IDSpace, ID: m.ID}

	ctx, shutdown := context.WithCancel(context.Background())
	r.Handler = func(ctx context.Context, _ *inbox.Message) error {
		shutdown()
		<-ctx.Done()
		return ctx.Err()
	}
	dec, _ := r.Deliver(ctx, m, k, inbox.Arrival{HasID: true}, inbox.Hooks{})
	fmt.Println("shutdown:", dec.Verb, dec.Delay)

	r2 := &inbox.Runner{Policy: r.Policy, Ledger: ledger,
		Handler: func(context.Context, *inbox.Message) error { return errors.New("cannot parse") }}
	for range 2 {
		dec, d := r2.Deliver(context.Background(), m, k, inbox.Arrival{HasID: true, MaybeRedelivered: true}, inbox.Hooks{})
		fmt.Println(d.State(), dec.Verb, "after", dec.Failures, "failed runs")
		if dec.Verb == inbox.VerbDeadLetter {
			// The broker's dead letter (a reject, a produce) succeeded.
			r2.DeadLettered(context.Background(), d, k, nil)
			fmt.Println(d.State())
		}
	}
	// Output:
	// shutdown: requeue 0s
	// retrying requeue after 1 failed runs
	// dead-lettering dead-letter after 2 failed runs
	// dead-lettered
}

// The dead letter's tombstone: on the last allowed failure the core asks
// the ledger to write the message's tombstone before the dead letter.
// Here another delivery of the message (one whose ack wait ended, a
// Kafka zombie's) committed its effect first: the tombstone's answer
// says so, and the core acks instead of dead-lettering. With a ledger of
// an inbox (inbox.SQL.Ledger) the tombstone and the effect conflict on
// the inbox's row of the id, so only one of them commits; an operator
// clears a dead letter's tombstone with SQLLedger.Redrive before
// redriving it.
func ExampleOpTombstone() {
	k := inbox.Key{ID: "order-42"}
	d := inbox.NewDelivery(inbox.Policy{Retry: inbox.Retry{MaxDeliveries: 1}})
	dec := d.Arrive(inbox.Arrival{HasID: true})
	fmt.Println(d.State(), dec.Verb)
	dec = d.Returned(inbox.Ending{Err: errors.New("cannot parse")})
	answers := map[inbox.Op]inbox.Record{
		inbox.OpFail:      {Failures: 1},
		inbox.OpTombstone: {Processed: true}, // the effect won
	}
	for dec.Write != inbox.OpNone {
		fmt.Println("write", dec.Write)
		dec = d.Recorded(answers[dec.Write], nil)
	}
	fmt.Println(d.State(), dec.Verb, k.ID)
	// Output:
	// running run
	// write fail
	// write tombstone
	// write forget
	// acked ack order-42
}
