package postgres_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
			db := countRoundTrips(b, newSchema(b).pool(b, int32(conc)))
			j := postgres.NewJournal(db, nil)
			benchParallel(b, conc, func(ctx context.Context, i int64) error {
				e := benchEntry(i)
				if _, err := j.Begin(ctx, e); err != nil {
					return err
				}
				return j.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
			})
		})
		b.Run("enqueue-claim-finish/c"+strconv.Itoa(conc), func(b *testing.B) {
			pool := countRoundTrips(b, newSchema(b).pool(b, int32(conc)))
			producer := postgres.NewJournal(pool, nil)
			// Workers live as long as the run, as in a fleet; the
			// goroutine for i uses worker i mod conc. A claim takes the
			// oldest free entry, not necessarily the one just enqueued.
			workers := make([]*postgres.Journal, conc)
			for w := range workers {
				workers[w] = postgres.NewJournal(pool, &postgres.JournalOptions{Worker: strconv.Itoa(w)})
			}
			var turn atomic.Int64
			benchParallel(b, conc, func(ctx context.Context, i int64) error {
				if _, err := producer.Enqueue(ctx, benchEntry(i)); err != nil {
					return err
				}
				w := workers[turn.Add(1)%int64(conc)]
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
		b.Run("enqueue-claim-resend/c"+strconv.Itoa(conc), func(b *testing.B) {
			pool := countRoundTrips(b, newSchema(b).pool(b, int32(conc)))
			producer := postgres.NewJournal(pool, nil)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusCreated)
			}))
			b.Cleanup(srv.Close)
			tr := &http.Transport{MaxIdleConnsPerHost: conc}
			b.Cleanup(tr.CloseIdleConnections)
			clients := make([]*idemhttp.Client, conc)
			workers := make([]*postgres.Journal, conc)
			for w := range workers {
				workers[w] = postgres.NewJournal(pool, &postgres.JournalOptions{Worker: strconv.Itoa(w)})
				clients[w] = &idemhttp.Client{HTTPClient: &http.Client{Transport: tr}, Journal: workers[w]}
			}
			var turn atomic.Int64
			benchParallel(b, conc, func(ctx context.Context, i int64) error {
				e := benchEntry(i)
				e.URL = srv.URL + "/v1/charges"
				if _, err := producer.Enqueue(ctx, e); err != nil {
					return err
				}
				w := turn.Add(1) % int64(conc)
				es, err := workers[w].ClaimPending(ctx, 1)
				if err != nil || len(es) == 0 {
					return err
				}
				res, err := clients[w].Resume(ctx, &idemhttp.ResumeOptions{Entries: es})
				if err != nil {
					return err
				}
				return res[0].Err
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

// roundTrips is a postgres.DB that counts the round trips made through
// it (a pipeline is one), which the benchmark reports per op: a measure
// that a loaded machine does not blur.
type roundTrips struct {
	postgres.DB
	n atomic.Int64
}

// countRoundTrips wraps db and reports its round trips per op when the
// benchmark ends.
func countRoundTrips(b *testing.B, db postgres.DB) *roundTrips {
	rt := &roundTrips{DB: db}
	b.Cleanup(func() {
		if b.N > 0 {
			b.ReportMetric(float64(rt.n.Load())/float64(b.N), "roundtrips/op")
		}
	})
	return rt
}

func (r *roundTrips) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.n.Add(1)
	return r.DB.Exec(ctx, sql, args...)
}

func (r *roundTrips) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.n.Add(1)
	return r.DB.Query(ctx, sql, args...)
}

func (r *roundTrips) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	r.n.Add(1)
	return r.DB.QueryRow(ctx, sql, args...)
}

func (r *roundTrips) SendBatch(ctx context.Context, bt *pgx.Batch) pgx.BatchResults {
	r.n.Add(1)
	return r.DB.SendBatch(ctx, bt)
}
