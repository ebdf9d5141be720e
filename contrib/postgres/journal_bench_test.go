package postgres_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

// BenchmarkJournal measures the journal's statements as a fleet uses
// them, against the test server, at one worker and at many:
//
//   - begin-finish: a Client's call of a new operation (Begin leases the
//     new entry to the caller, Finish records it done).
//   - enqueue-claim-finish: one entry's way through a fleet (a producer's
//     Enqueue, a worker's ClaimPending of it, the Begin of the Client that
//     resends it, which finds the entry, and its Finish).
//
// Each op is one entry. Run it on the code before and after a change in
// one session, alternating, and compare the medians (see the README).
func BenchmarkJournal(b *testing.B) {
	for _, conc := range []int{1, 16} {
		b.Run("begin-finish/c"+strconv.Itoa(conc), func(b *testing.B) {
			j := postgres.NewJournal(newSchema(b).pool(b, int32(conc)), nil)
			benchParallel(b, conc, func(ctx context.Context, i int64) error {
				e := benchEntry(i)
				if _, err := j.Begin(ctx, e); err != nil {
					return err
				}
				return j.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
			})
		})
		b.Run("enqueue-claim-finish/c"+strconv.Itoa(conc), func(b *testing.B) {
			pool := newSchema(b).pool(b, int32(conc))
			producer := postgres.NewJournal(pool, nil)
			benchParallel(b, conc, func(ctx context.Context, i int64) error {
				if _, err := producer.Enqueue(ctx, benchEntry(i)); err != nil {
					return err
				}
				// A worker per goroutine call: the claim takes the oldest
				// free entry, not necessarily the one just enqueued.
				w := postgres.NewJournal(pool, nil)
				es, err := w.ClaimPending(ctx, 1)
				if err != nil || len(es) == 0 {
					return err
				}
				e := es[0]
				if _, err := w.Begin(ctx, e); err != nil {
					return err
				}
				return w.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
			})
		})
	}
}

// benchParallel runs fn b.N times on conc goroutines, each call with a
// distinct i, and fails the benchmark on the first error.
func benchParallel(b *testing.B, conc int, fn func(ctx context.Context, i int64) error) {
	ctx := context.Background()
	var (
		next     atomic.Int64
		mu       sync.Mutex
		firstErr error
	)
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan struct{})
	for range conc {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	for range conc {
		<-done
	}
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
}

func benchEntry(i int64) *idemhttp.Entry {
	k := "bench-" + strconv.FormatInt(i, 10)
	return &idemhttp.Entry{
		Operation: "op-" + k,
		Key:       k,
		Method:    http.MethodPost,
		URL:       "https://api.example.com/v1/charges",
		Header:    http.Header{"Content-Type": {"application/json"}},
		Body:      []byte(`{"amount":1099,"currency":"eur","key":"` + k + `"}`),
	}
}
