package postgres_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// BenchmarkTxMiddleware serves a charge (one INSERT and its commit) at 64
// concurrent requests with distinct keys:
//
//   - plain: the handler begins and commits its own transaction, with no
//     idempotency (the baseline);
//   - tx: the same handler under TxMiddleware, the record in its
//     transaction;
//   - store: idemserver.Middleware with the PostgreSQL Store around the
//     plain handler (claim and record in transactions of their own).
//
// Requests go straight to ServeHTTP, without a network, so that the
// difference is the database work.
func BenchmarkTxMiddleware(b *testing.B) {
	const conc = 64
	s := newTxSchema(b)
	pool := s.pool(b, conc)
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { return chargeTx(w, r, tx) })
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	tx := newTx(b, s, conc, nil)
	store := &idemserver.Middleware{Store: newStore(b, pool), SingleTenant: true}
	handlers := []struct {
		name string
		h    http.Handler
	}{
		{"plain", plain},
		{"tx", tx.WrapFunc(chargeTx)},
		{"store", store.Wrap(plain)},
	}
	var keys atomic.Uint64
	for _, hh := range handlers {
		b.Run(hh.name+"/c"+strconv.Itoa(conc), func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("amount=1099"))
					req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatUint(keys.Add(1), 36))
					rec := httptest.NewRecorder()
					hh.h.ServeHTTP(rec, req)
					if rec.Code != http.StatusCreated {
						b.Errorf("status %d: %s", rec.Code, rec.Body)
						return
					}
				}
			})
		})
	}
}

// BenchmarkTxMiddlewareInterleaved sends plain and tx requests alternately
// from the same 64 goroutines, so that both meet the same load at the same
// moment (the machine is shared), and reports tx-latency/plain-latency:
// at equal concurrency, the inverse of the throughput ratio.
//
// When the server runs on this machine it also reports the CPU time its
// backends spent per request on each side (pg-cpu-plain-us and
// pg-cpu-tx-us, from /proc; the server's background processes, which the
// two sides share, are not in them), their ratio, and the share of the
// key table's updates that were HOT (heap-only, no index entry written).
func BenchmarkTxMiddlewareInterleaved(b *testing.B) {
	const conc = 64
	s := newTxSchema(b)
	var bk [2]backends
	pool := backendPool(b, s, conc, &bk[0])
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { return chargeTx(w, r, tx) })
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	txPool := backendPool(b, s, conc, &bk[1])
	mw, err := postgres.NewTxMiddleware(context.Background(), txPool, &postgres.TxOptions{SingleTenant: true})
	require.NoError(b, err)
	interleave(b, s, [2]*pgxpool.Pool{pool, txPool}, &bk, [2]http.Handler{plain, mw.WrapFunc(chargeTx)})
}

// BenchmarkTxFloorInterleaved is BenchmarkTxMiddlewareInterleaved with,
// in place of TxMiddleware, the least the database must do to keep a
// response with the handler's write, by hand, in the handler's own
// transaction on the key table, so that its pg-cpu-ratio bounds what
// TxMiddleware's can reach:
//
//   - insert: one insert of the key's row, response included, after the
//     charge (no claim: nothing keeps a duplicate from running meanwhile);
//   - claim-store: the key's row inserted before the charge, its response
//     stored after it (an update), as TxMiddleware does, without its
//     advisory lock and its checks that the transaction is the claim's.
//
// The "tx" metrics are the floor's.
func BenchmarkTxFloorInterleaved(b *testing.B) {
	const record = 120 // bytes: about what TxMiddleware stores for chargeTx's 201
	for _, name := range []string{"insert", "claim-store"} {
		b.Run(name, func(b *testing.B) {
			const conc = 64
			s := newTxSchema(b)
			var bk [2]backends
			pool := backendPool(b, s, conc, &bk[0])
			plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { return chargeTx(w, r, tx) })
				if err != nil {
					w.WriteHeader(http.StatusInternalServerError)
				}
			})
			floorPool := backendPool(b, s, conc, &bk[1])
			rec := make([]byte, record)
			floor := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				key := postgres.ScopedRowKey("", r.Header.Get("Idempotency-Key"))
				err := pgx.BeginFunc(r.Context(), floorPool, func(tx pgx.Tx) error {
					ctx := r.Context()
					if name == "claim-store" {
						if _, err := tx.Exec(ctx, `INSERT INTO idemhttp_keys (key, token, fingerprint, record, expires_at)
VALUES ($1, 'token', 'fingerprint', NULL, now() + interval '1 day')`, key); err != nil {
							return err
						}
					}
					if err := chargeTx(w, r, tx); err != nil {
						return err
					}
					if name == "claim-store" {
						_, err := tx.Exec(ctx, `UPDATE idemhttp_keys SET record = $2 WHERE key = $1`, key, rec)
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO idemhttp_keys (key, token, fingerprint, record, expires_at)
VALUES ($1, 'token', 'fingerprint', $2, now() + interval '1 day')`, key, rec)
					return err
				})
				if err != nil {
					b.Error(err)
				}
			})
			interleave(b, s, [2]*pgxpool.Pool{pool, floorPool}, &bk, [2]http.Handler{plain, floor})
		})
	}
}

// interleave runs the interleaved benchmark of handlers[0] (plain, on
// pools[0]) against handlers[1] (tx, on pools[1]), the backends of each
// pool recorded in bk.
func interleave(b *testing.B, s *testSchema, pools [2]*pgxpool.Pool, bk *[2]backends, handlers [2]http.Handler) {
	const conc = 64
	var (
		keys  atomic.Uint64
		nanos [2]atomic.Int64
		count [2]atomic.Int64
	)
	serve := func(which int) bool {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("amount=1099"))
		req.Header.Set("Idempotency-Key", "bench-"+strconv.FormatUint(keys.Add(1), 36))
		rec := httptest.NewRecorder()
		start := time.Now()
		handlers[which].ServeHTTP(rec, req)
		nanos[which].Add(int64(time.Since(start)))
		count[which].Add(1)
		if rec.Code != http.StatusCreated {
			b.Errorf("status %d: %s", rec.Code, rec.Body)
			return false
		}
		return true
	}
	// Warm up: open every connection of both pools, and prepare their
	// statements, before the mark.
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for i := range 4 {
				serve(i % 2)
			}
		})
	}
	wg.Wait()
	measured := bk[0].mark() && bk[1].mark()
	for i := range nanos {
		nanos[i].Store(0)
		count[i].Store(0)
	}
	b.ReportAllocs()
	b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if !serve(i % 2) {
				return
			}
		}
	})
	b.StopTimer()
	if count[0].Load() == 0 || count[1].Load() == 0 {
		return
	}
	plainMean := float64(nanos[0].Load()) / float64(count[0].Load())
	txMean := float64(nanos[1].Load()) / float64(count[1].Load())
	b.ReportMetric(plainMean/txMean, "tx-throughput-ratio")
	if !measured {
		return
	}
	cpu := [2]float64{
		float64(bk[0].since().Microseconds()) / float64(count[0].Load()),
		float64(bk[1].since().Microseconds()) / float64(count[1].Load()),
	}
	b.ReportMetric(cpu[0], "pg-cpu-plain-us")
	b.ReportMetric(cpu[1], "pg-cpu-tx-us")
	b.ReportMetric(cpu[1]/cpu[0], "pg-cpu-ratio")
	pools[0].Close()
	pools[1].Close()
	// Every tx request (and warm-up request) updated its claim row once.
	if upd, hot := hotUpdates(b, s); upd > 0 {
		b.ReportMetric(100*float64(hot)/float64(upd), "hot-update-%")
	}
}
