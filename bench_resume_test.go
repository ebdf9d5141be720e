package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/internal/contract"
)

// BenchmarkResumeFloorFileJournal is BenchmarkResumeFloor with a
// filejournal.Journal holding the pending entries (IDEMHTTP_RESUME_N,
// default 320; IDEMHTTP_RESUME_LATENCY_MS, default 20), as a batch that
// crashed leaves them: Resume's time against ceil(n/16) × latency, beside
// "raw", the same requests through net/http alone.
func BenchmarkResumeFloorFileJournal(b *testing.B) {
	n, conc, latency := 320, 16, 20*time.Millisecond
	if v := envInt("IDEMHTTP_RESUME_N"); v > 0 {
		n = v
	}
	if v := envInt("IDEMHTTP_RESUME_LATENCY_MS"); v > 0 {
		latency = time.Duration(v) * time.Millisecond
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		w.WriteHeader(http.StatusCreated)
	}))
	b.Cleanup(srv.Close)
	floor := time.Duration((n+conc-1)/conc) * latency
	var spent, rawSpent time.Duration
	var perRaw []float64 // per iteration: Resume's time ÷ raw's
	for b.Loop() {
		b.StopTimer()
		j := pendingFileJournal(b, srv.URL, n)
		c := &idemhttp.Client{Journal: j, HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}}
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
		b.StartTimer()
		start := time.Now()
		results, err := c.Resume(context.Background(), &idemhttp.ResumeOptions{Concurrency: conc})
		took := time.Since(start)
		spent += took
		if err != nil || len(results) != n {
			b.Fatal(err, len(results))
		}
		for _, r := range results {
			if r.Err != nil || r.StatusCode != http.StatusCreated {
				b.Fatal(r.Err, r.StatusCode)
			}
		}
		start = time.Now()
		var wg sync.WaitGroup
		var next atomic.Int64
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
					resp, err := hc.Post(fmt.Sprintf("%s/charges/%d", srv.URL, i), "application/json", strings.NewReader(`{"op":1}`))
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}()
		}
		wg.Wait()
		rawTook := time.Since(start)
		rawSpent += rawTook
		perRaw = append(perRaw, float64(took)/float64(rawTook))
		b.StopTimer()
		c.HTTPClient.CloseIdleConnections()
		hc.CloseIdleConnections()
		if err := j.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(spent)/float64(b.N)/float64(floor), "x-floor")
	b.ReportMetric(float64(rawSpent)/float64(b.N)/float64(floor), "raw-x-floor")
	b.ReportMetric(float64(spent.Milliseconds())/float64(b.N), "ms/resume")
	b.ReportMetric(medianOf(perRaw), "x-raw")
}

// pendingFileJournal returns a file journal in a new directory holding n
// pending entries, a POST each to url, closed and opened again, as a
// batch that crashed leaves it.
func pendingFileJournal(b *testing.B, url string, n int) *filejournal.Journal {
	b.Helper()
	path := filepath.Join(b.TempDir(), "journal")
	j, err := filejournal.Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for i := range n {
		body := []byte(fmt.Sprintf(`{"op":%d}`, i))
		u := fmt.Sprintf("%s/charges/%d", url, i)
		e := &idemhttp.Entry{
			Operation: fmt.Sprintf("op-%04d", i), Key: idemhttp.NewKey(), Method: http.MethodPost, URL: u,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: body, Fingerprint: contract.Fingerprint(http.MethodPost, u, body),
			Created: now, Updated: now, State: idemhttp.StatePending,
		}
		if _, err := j.Begin(context.Background(), e); err != nil {
			b.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
	if j, err = filejournal.Open(path, nil); err != nil {
		b.Fatal(err)
	}
	return j
}

// medianOf returns the median of xs (which it sorts), 0 for none.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	m := len(xs) / 2
	if len(xs)%2 == 0 {
		return (xs[m-1] + xs[m]) / 2
	}
	return xs[m]
}

func envInt(name string) int {
	var n int
	_, _ = fmt.Sscan(os.Getenv(name), &n)
	return n
}
