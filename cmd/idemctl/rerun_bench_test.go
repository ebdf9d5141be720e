package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/stretchr/testify/require"
)

// rerunRows is how many done rows the rerun benchmarks decide.
const rerunRows = 100_000

// doneJournal returns a journal at path holding n done operations, each
// with a charge-sized body, and the input rows that name them.
func doneJournal(b *testing.B, path string, n int) (*filejournal.Journal, []operation) {
	b.Helper()
	fj, err := filejournal.Open(path, nil)
	require.NoError(b, err)
	ops := make([]operation, n)
	for i := range ops {
		id := fmt.Sprintf("charge-%07d", i)
		ops[i] = operation{
			Line: i + 1, ID: id, Method: "POST", URL: "http://127.0.0.1:8080/v1/charges",
			Body: fmt.Appendf(nil, `{"amount":%d,"currency":"usd","customer":"cus_%012d","description":"order %s","metadata":{"operation":%q}}`, 100+i, i, id, id),
		}
	}
	// 64 writers, so group commit shares the syncs.
	ctx := context.Background()
	work := make(chan operation)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for op := range work {
				now := time.Now()
				e := &idemhttp.Entry{
					Operation: op.ID, Key: idemhttp.NewKey(), Method: op.Method, URL: op.URL, Body: op.Body,
					Fingerprint: fingerprint(op), Created: now, Updated: now, State: idemhttp.StatePending,
				}
				if _, err := fj.Begin(ctx, e); err != nil {
					errs <- err
					return
				}
				if err := fj.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: now}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for _, op := range ops {
		work <- op
	}
	close(work)
	wg.Wait()
	close(errs)
	require.NoError(b, <-errs)
	require.NoError(b, fj.Sync(ctx))
	return fj, ops
}

// BenchmarkRerunDecide measures how a batch rerun decides 100,000 rows that
// are all done, per rerun: entries is the old way (every entry read back
// with its body through Entries, each row's fingerprint compared), lookup
// the new default (one Lookup per row, from the index), checkdone the new
// way with -check-done (Lookup, then Get and the fingerprint per row).
func BenchmarkRerunDecide(b *testing.B) {
	fj, ops := doneJournal(b, filepath.Join(b.TempDir(), "journal"), rerunRows)
	defer fj.Close()
	ctx := context.Background()
	b.Run("entries", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			entries, err := fj.Entries(ctx)
			if err != nil {
				b.Fatal(err)
			}
			byOp := make(map[string]*idemhttp.Entry, len(entries))
			for _, en := range entries {
				byOp[en.Operation] = en
			}
			for _, op := range ops {
				en := byOp[op.ID]
				if en == nil || en.State != idemhttp.StateDone || en.Fingerprint != fingerprint(op) {
					b.Fatal("not done", op.ID)
				}
			}
		}
	})
	b.Run("lookup", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, op := range ops {
				en, err := fj.Lookup(ctx, op.ID)
				if err != nil || en.State != idemhttp.StateDone {
					b.Fatal("not done", op.ID, err)
				}
			}
		}
	})
	b.Run("checkdone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, op := range ops {
				en, err := fj.Lookup(ctx, op.ID)
				if err != nil || en.State != idemhttp.StateDone {
					b.Fatal("not done", op.ID, err)
				}
				full, err := fj.Get(ctx, en.Key)
				if err != nil || full.Fingerprint != fingerprint(op) {
					b.Fatal("changed", op.ID, err)
				}
			}
		}
	})
}
