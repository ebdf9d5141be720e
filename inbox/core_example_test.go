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
