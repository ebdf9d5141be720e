package idemhttp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pendingJournal returns a memory journal holding n pending entries for
// url, created a millisecond apart so their order is known.
func pendingJournal(t testing.TB, url string, n int) *memJournal {
	t.Helper()
	j := newMemJournal(24 * time.Hour)
	base := time.Now().Add(-time.Minute)
	for i := range n {
		body := []byte(fmt.Sprintf(`{"op":%d}`, i))
		u := fmt.Sprintf("%s/charges/%d", url, i)
		created := base.Add(time.Duration(i) * time.Millisecond)
		e := &Entry{
			Operation: fmt.Sprintf("op-%04d", i), Key: fmt.Sprintf("key-%04d", i), Method: http.MethodPost, URL: u,
			Header: http.Header{}, Body: body, Fingerprint: contract.Fingerprint(http.MethodPost, u, body),
			Created: created, Updated: created, State: StatePending,
		}
		_, err := j.Begin(context.Background(), e)
		require.NoError(t, err)
	}
	return j
}

// slowServer answers after delay and records the most requests it had in
// flight at once.
type slowServer struct {
	*httptest.Server
	inFlight, maxInFlight, hits atomic.Int32
}

func newSlowServer(t testing.TB, delay time.Duration) *slowServer {
	s := &slowServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := s.inFlight.Add(1)
		for m := s.maxInFlight.Load(); n > m && !s.maxInFlight.CompareAndSwap(m, n); m = s.maxInFlight.Load() {
		}
		s.hits.Add(1)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		s.inFlight.Add(-1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(s.Close)
	return s
}

// Issue 15, item 1: Resume sends concurrently, bounded, and returns the
// results in journal order.
func TestResumeIsConcurrentAndOrdered(t *testing.T) {
	srv := newSlowServer(t, 5*time.Millisecond)
	j := pendingJournal(t, srv.URL, 64)
	c := &Client{Policy: unnamed(nil), Journal: j}
	results, err := c.Resume(context.Background(), &ResumeOptions{Concurrency: 8})
	require.NoError(t, err)
	require.Len(t, results, 64)
	for i, r := range results {
		assert.NoError(t, r.Err)
		assert.Equal(t, http.StatusCreated, r.StatusCode)
		assert.Equal(t, fmt.Sprintf("op-%04d", i), r.Entry.Operation, "journal order")
	}
	assert.LessOrEqual(t, srv.maxInFlight.Load(), int32(8))
	assert.Greater(t, srv.maxInFlight.Load(), int32(1), "more than one at a time")
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	assert.Empty(t, pending)
}

// Issue 15, item 1: a filter picks entries; OnResult streams results, one
// call at a time.
func TestResumeFilterAndStream(t *testing.T) {
	srv := newSlowServer(t, time.Millisecond)
	j := pendingJournal(t, srv.URL, 20)
	c := &Client{Policy: unnamed(nil), Journal: j}
	var (
		mu      sync.Mutex
		calls   int
		inside  atomic.Int32
		overlap bool
	)
	results, err := c.Resume(context.Background(), &ResumeOptions{
		Filter: func(e *Entry) bool { return strings.HasSuffix(e.Operation, "0") || strings.HasSuffix(e.Operation, "5") },
		OnResult: func(r ResumeResult) {
			if inside.Add(1) > 1 {
				overlap = true
			}
			mu.Lock()
			calls++
			mu.Unlock()
			inside.Add(-1)
		},
	})
	require.NoError(t, err)
	assert.Nil(t, results, "streamed, not collected")
	assert.Equal(t, 4, calls)
	assert.False(t, overlap, "OnResult is never called concurrently")
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	assert.Len(t, pending, 16, "filtered-out entries stay pending")
}

// Issue 15, item 1: cancelling leaves the entries not reached pending, and
// returns the results of those reached.
func TestResumeCancelLeavesTheRestPending(t *testing.T) {
	srv := newSlowServer(t, 20*time.Millisecond)
	j := pendingJournal(t, srv.URL, 100)
	c := &Client{Policy: unnamed(nil), Journal: j}
	ctx, cancel := context.WithCancel(context.Background())
	var done atomic.Int32
	results, err := c.Resume(ctx, &ResumeOptions{Concurrency: 2, OnResult: func(ResumeResult) {
		if done.Add(1) == 4 {
			cancel()
		}
	}})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Nil(t, results)
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(pending), 90, "the entries not reached stay pending")
	assert.Less(t, int(srv.hits.Load()), 10)
}

// BenchmarkResume resumes pending entries against a server that answers
// after 10 ms, one at a time (the old Resume) and 16 at a time (the new
// default), in one run. IDEMHTTP_RESUME_N sets the count (default 200;
// the 10,000 takes about 100 s serially).
func BenchmarkResume(b *testing.B) {
	n := 200
	if v := envInt("IDEMHTTP_RESUME_N"); v > 0 {
		n = v
	}
	srv := newSlowServer(b, 10*time.Millisecond)
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("c%d", conc), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				j := pendingJournal(b, srv.URL, n)
				c := &Client{Policy: unnamed(nil), Journal: j, HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}}
				b.StartTimer()
				results, err := c.Resume(context.Background(), &ResumeOptions{Concurrency: conc})
				if err != nil || len(results) != n {
					b.Fatal(err, len(results))
				}
				c.HTTPClient.CloseIdleConnections()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/resume")
		})
	}
}

func envInt(name string) int {
	var n int
	_, _ = fmt.Sscan(os.Getenv(name), &n)
	return n
}
