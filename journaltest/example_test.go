package journaltest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/journaltest"
)

// A fleet journal as a model: two workers share it, a Begin leases the
// entry to its worker, another worker's claim skips it until the lease
// ends, and a stale worker's outcome is refused.
func ExampleFleetModel() {
	ctx := context.Background()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	fleet := journaltest.NewFleetModel(&journaltest.FleetModelOptions{
		Clock: func() time.Time { return now }, // the database's clock
		Lease: time.Minute,
	})
	a, b := fleet.Worker("a"), fleet.Worker("b")

	_, _ = a.Begin(ctx, &idemhttp.Entry{Operation: "invoice-42", Key: "k1", Method: http.MethodPost, URL: "https://api.example.com/v1/charges"})
	claimed, _ := b.ClaimPending(ctx, 10)
	fmt.Println("b claims while a's lease lasts:", len(claimed))

	fleet.Shift(2 * time.Minute) // a stalls past its lease
	claimed, _ = b.ClaimPending(ctx, 10)
	fmt.Println("b claims once it ended:", len(claimed), claimed[0].Key)

	err := a.Finish(ctx, "k1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
	fmt.Println("a's late outcome is fenced:", errors.Is(err, idemhttp.ErrFenced))
	err = a.Delete(ctx, "k1")
	fmt.Println("and so is its withdrawal:", errors.Is(err, idemhttp.ErrFenced))
	// Output:
	// b claims while a's lease lasts: 0
	// b claims once it ended: 1 k1
	// a's late outcome is fenced: true
	// and so is its withdrawal: true
}

// The fleet's database clock set back (a failover to a host whose clock
// is behind): the journal keeps the set-back as its doubt, for good, so
// entries written before it stay of unknown age after a downtime carries
// the clock past the high-water mark again.
func ExampleFleetModelWorker_ClockDoubt() {
	ctx := context.Background()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	fleet := journaltest.NewFleetModel(&journaltest.FleetModelOptions{Clock: func() time.Time { return now }})
	w := fleet.Worker("a")
	_, _ = w.Begin(ctx, &idemhttp.Entry{Operation: "invoice-42", Key: "k1", Method: http.MethodPost, URL: "https://api.example.com/v1/charges"})

	fleet.Shift(-2 * time.Hour) // the failover
	_, err := w.ClaimPending(ctx, 10)
	fmt.Println("claim refused:", errors.Is(err, idemhttp.ErrClockJump))
	fleet.Shift(3 * time.Hour) // a downtime: the clock passes the mark
	doubt, _ := w.ClockDoubt(ctx)
	fmt.Println("doubt:", doubt.Format(time.RFC3339))
	// Output:
	// claim refused: true
	// doubt: 2025-03-01T12:00:00Z
}
