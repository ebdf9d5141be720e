//go:build idemhttp_logjournal

// Experimental, not built by default (issue 4, still open): an
// append-only log engine for the journal, measured at 0.45x to 0.50x of
// unjournaled throughput at concurrency 64 against bbolt's 0.31x. Known
// gaps before it may ship: a crash that leaves a hole inside the last,
// unacknowledged batch with valid records after it is reported as
// ErrJournalCorrupt instead of truncated (records need a batch sequence or
// commit marker); compaction only on Open; no Entries/Delete/Verify; body
// CRCs checked only at Open. Build and test with -tags idemhttp_logjournal.

package idemhttp_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
)

// BenchmarkLogJournal is BenchmarkJournalInterleaved with a LogJournal:
// rounds of unjournaled requests alternate with rounds of journaled ones,
// and ratio is the median over rounds of unjournaled time divided by
// journaled time. syncs/req counts fdatasync calls per request: 2 for a
// lone caller (Begin and Finish), far less under group commit.
func BenchmarkLogJournal(b *testing.B) {
	payload := bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	defer srv.Close()

	for _, concurrency := range []int{1, 64} {
		b.Run(fmt.Sprintf("c%d", concurrency), func(b *testing.B) {
			j, err := idemhttp.OpenLogJournal(filepath.Join(b.TempDir(), "journal.log"), nil)
			require.NoError(b, err)
			defer func() { require.NoError(b, j.Close()) }()
			raw := newBenchSender(srv.URL, payload, nil)
			journaled := newBenchSender(srv.URL, payload, nil)
			journaled.c.Journal = j
			defer raw.close()
			defer journaled.close()

			rounds := 6
			if b.N < rounds*concurrency {
				rounds = 1
			}
			var ratios, rawNs, jNs []float64
			var rawCPU, jCPU time.Duration
			before := j.Stats()
			b.ResetTimer()
			for r := range rounds {
				n := b.N / rounds
				if r == rounds-1 {
					n = b.N - n*(rounds-1)
				}
				dRaw, cRaw := raw.run(b, n, concurrency)
				dJ, cJ := journaled.run(b, n, concurrency)
				rawCPU += cRaw
				jCPU += cJ
				ratios = append(ratios, float64(dRaw)/float64(dJ))
				rawNs = append(rawNs, float64(dRaw)/float64(n))
				jNs = append(jNs, float64(dJ)/float64(n))
			}
			b.StopTimer()
			b.ReportMetric(benchMedian(ratios), "ratio")
			b.ReportMetric(benchMedian(rawNs), "raw-ns/req")
			b.ReportMetric(benchMedian(jNs), "journal-ns/req")
			b.ReportMetric(float64(rawCPU.Microseconds())/float64(b.N), "raw-cpu-µs/req")
			b.ReportMetric(float64(jCPU.Microseconds())/float64(b.N), "journal-cpu-µs/req")
			b.ReportMetric(float64(j.Stats().Commits-before.Commits)/float64(b.N), "syncs/req")
		})
	}
}
