package filejournal_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

// BenchmarkFileJournal measures what durability costs a request, without
// the request: one Begin, on disk before it returns, and one Finish,
// written behind. syncs/op is the number of group commits per request;
// without group commit it would be 2 at any concurrency.
func BenchmarkFileJournal(b *testing.B) {
	for _, concurrency := range []int{1, 64} {
		b.Run(fmt.Sprintf("concurrency=%d", concurrency), func(b *testing.B) {
			j, err := filejournal.Open(filepath.Join(b.TempDir(), "journal.db"), nil)
			require.NoError(b, err)
			b.Cleanup(func() { require.NoError(b, j.Close()) })

			var seq atomic.Int64
			body := []byte(`{"amount":1000,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3"}`)
			request := func() error {
				ctx := context.Background()
				key := fmt.Sprintf("bench-%d", seq.Add(1))
				e := &idemhttp.Entry{
					Key:         key,
					Method:      http.MethodPost,
					URL:         "https://api.example.com/v1/charges",
					Header:      http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}},
					Body:        body,
					Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
				}
				if _, err := j.Begin(ctx, e); err != nil {
					return err
				}
				return j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
			}

			before := j.Stats()
			b.ReportAllocs()
			b.ResetTimer()
			if concurrency == 1 {
				for range b.N {
					if err := request(); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				// RunParallel starts parallelism × GOMAXPROCS goroutines.
				b.SetParallelism((concurrency + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := request(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.StopTimer()
			b.ReportMetric(float64(j.Stats().Commits-before.Commits)/float64(b.N), "syncs/op")
		})
	}
}
