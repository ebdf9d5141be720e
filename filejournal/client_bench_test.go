package filejournal_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

// BenchmarkJournal measures what a Journal costs a real request: the
// same 1 KiB JSON POST through idemhttp.Client to one loopback server,
// without a journal and with one, alone and with 64 concurrent callers.
// The nojournal run is the baseline of the filejournal run beside it;
// they share the server and differ only in Client.Journal.
//
// syncs/req is the journal's group commits (each one synchronous write)
// per request: about 1 for a lone caller (Begin waits for its own;
// Finish's record is written behind and starts no commit, so it goes with
// the next Begin's), and far less at c64, where concurrent calls share
// them.
func BenchmarkJournal(b *testing.B) {
	srv, payload := newJournalBenchServer()
	defer srv.Close()

	for _, concurrency := range []int{1, 64} {
		b.Run(fmt.Sprintf("c%d", concurrency), func(b *testing.B) {
			b.Run("nojournal", func(b *testing.B) {
				benchJournalRequests(b, srv.URL, payload, concurrency, nil)
			})
			b.Run("filejournal", func(b *testing.B) {
				j, err := filejournal.Open(filepath.Join(b.TempDir(), "journal.db"), nil)
				require.NoError(b, err)
				defer func() { require.NoError(b, j.Close()) }()
				before := j.Stats()
				n := benchJournalRequests(b, srv.URL, payload, concurrency, j)
				b.ReportMetric(float64(j.Stats().Commits-before.Commits)/float64(n), "syncs/req")
			})
		})
	}
}

// benchJournalRequests sends POSTs of payload to url through a Client with
// journal j (nil for none) from concurrency goroutines, and returns how
// many it sent.
func benchJournalRequests(b *testing.B, url string, payload []byte, concurrency int, j *filejournal.Journal) int {
	s := newBenchSender(url, payload, j)
	defer s.close()
	send := s.send

	b.ReportAllocs()
	if concurrency == 1 {
		n := 0
		for b.Loop() {
			if err := send(); err != nil {
				b.Fatal(err)
			}
			n++
		}
		return n
	}
	// RunParallel starts parallelism × GOMAXPROCS goroutines: 64 on this
	// project's 2-core machines, at least 64 anywhere.
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((concurrency + procs - 1) / procs)
	b.ResetTimer() // b.Loop does this for c1; opening the journal is not a request
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := send(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	return b.N
}

// BenchmarkJournalInterleaved is BenchmarkJournal for a shared, noisy
// machine: one op is a pair of requests, one without the journal and one
// with it, run in alternating rounds (a batch of unjournaled requests,
// then a batch of journaled ones, six times), so that load from elsewhere
// hits both sides alike. ratio is the median over rounds of unjournaled
// time divided by journaled time: the journaled throughput as a fraction
// of the unjournaled. cpu-µs/req is process CPU time (user and system,
// the in-process server included) per request on each side.
func BenchmarkJournalInterleaved(b *testing.B) {
	srv, payload := newJournalBenchServer()
	defer srv.Close()

	for _, concurrency := range []int{1, 64} {
		b.Run(fmt.Sprintf("c%d", concurrency), func(b *testing.B) {
			j, err := filejournal.Open(filepath.Join(b.TempDir(), "journal.db"), nil)
			require.NoError(b, err)
			defer func() { require.NoError(b, j.Close()) }()
			raw, journaled := newBenchSender(srv.URL, payload, nil), newBenchSender(srv.URL, payload, j)
			defer raw.close()
			defer journaled.close()

			rounds := 6
			if b.N < rounds*concurrency {
				rounds = 1 // the framework's first, tiny probe
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

// newJournalBenchServer starts the loopback server the journal benchmarks
// send to, a Stripe-like charge endpoint, and returns it with the 1 KiB
// JSON body they send.
func newJournalBenchServer() (*httptest.Server, []byte) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	return srv, bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
}

// benchSender sends the benchmark's POSTs through one Client, whose
// connections stay warm from round to round.
type benchSender struct {
	tr      *http.Transport
	c       *idemhttp.Client
	url     string
	payload []byte
}

func newBenchSender(url string, payload []byte, j *filejournal.Journal) *benchSender {
	// 64 idle connections per host, one per caller at c64: with net/http's
	// default of 2, most callers would dial (and leave a TIME_WAIT socket)
	// on every request, and the benchmark would measure connection churn
	// instead of the journal.
	tr := &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 64}
	// Unnamed calls, as the numbers before the default refused them: an
	// operation id would add a lookup per call, which is not what these
	// figures compare.
	pol := idemhttp.DefaultPolicy()
	pol.AllowUnnamed = true
	c := &idemhttp.Client{HTTPClient: &http.Client{Transport: tr}, Policy: pol}
	if j != nil {
		c.Journal = j
	}
	return &benchSender{tr: tr, c: c, url: url, payload: payload}
}

func (s *benchSender) close() { s.tr.CloseIdleConnections() }

func (s *benchSender) send() error {
	req, err := http.NewRequest(http.MethodPost, s.url, bytes.NewReader(s.payload))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.c.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if err := resp.Body.Close(); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// run sends n requests from concurrency goroutines and returns the wall
// time and the process CPU time they took.
func (s *benchSender) run(b *testing.B, n, concurrency int) (wall, cpu time.Duration) {
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	cpu0, start := benchCPUTime(), time.Now()
	for range min(concurrency, n) {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := s.send(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), benchCPUTime() - cpu0
}

func benchMedian(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
