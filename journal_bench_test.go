package idemhttp_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
)

// BenchmarkJournal measures what a FileJournal costs a real request: the
// same 1 KiB JSON POST through idemhttp.Client to one loopback server,
// without a journal and with one, alone and with 64 concurrent callers.
// The nojournal run is the baseline of the filejournal run beside it;
// they share the server and differ only in Client.Journal.
//
// syncs/req is the journal's commits (each a bbolt commit, two fdatasyncs)
// per request: 2 for a lone caller (Begin before sending, Finish after),
// and far less at c64, where group commit makes concurrent calls share
// them.
func BenchmarkJournal(b *testing.B) {
	payload := bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	defer srv.Close()

	for _, concurrency := range []int{1, 64} {
		b.Run(fmt.Sprintf("c%d", concurrency), func(b *testing.B) {
			b.Run("nojournal", func(b *testing.B) {
				benchJournalRequests(b, srv.URL, payload, concurrency, nil)
			})
			b.Run("filejournal", func(b *testing.B) {
				j, err := idemhttp.OpenFileJournal(filepath.Join(b.TempDir(), "journal.db"), nil)
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
func benchJournalRequests(b *testing.B, url string, payload []byte, concurrency int, j *idemhttp.FileJournal) int {
	// 64 idle connections per host, one per caller at c64: with net/http's
	// default of 2, most callers would dial (and leave a TIME_WAIT socket)
	// on every request, and the benchmark would measure connection churn
	// instead of the journal.
	tr := &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	c := &idemhttp.Client{HTTPClient: &http.Client{Transport: tr}}
	if j != nil { // a nil *FileJournal in the interface would not be a nil Journal
		c.Journal = j
	}
	send := func() error {
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
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
