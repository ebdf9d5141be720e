package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/idemkit/idemhttp/idemtrace"
)

// The contract tests run idemhttp.Client against the fake API under every
// fault kind and check the two promises: no operation runs twice, and no
// operation is lost.

// attemptTimeout bounds one attempt; a slow reply outlasts it. It is long
// enough that a normal reply on a busy, race-instrumented machine fits.
const attemptTimeout = 300 * time.Millisecond

// result is what the client returned for one operation.
type result struct {
	status   int
	replayed bool
	attempts int
	err      error
}

// newClient returns an idemhttp.Client for srv with tiny delays and no
// retry budget, so every operation gets all its attempts.
func newClient(srv *idemtest.Server, pol idemhttp.Policy) *idemhttp.Client {
	hc := *srv.Client() // shares the server's transport, which Close shuts
	hc.Timeout = attemptTimeout
	if pol.BaseDelay == 0 {
		pol.BaseDelay = time.Millisecond
	}
	if pol.MaxDelay == 0 {
		pol.MaxDelay = 4 * time.Millisecond
	}
	if pol.MaxAttempts == 0 {
		pol.MaxAttempts = 6
	}
	pol.Budget.Disabled = true
	return &idemhttp.Client{HTTPClient: &hc, Policy: &pol}
}

// charge sends one charge for op through c.
func charge(ctx context.Context, c *idemhttp.Client, url, op string) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/charges", strings.NewReader(chargeBody(op)))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	info, _ := idemhttp.ResponseInfo(resp)
	return result{status: resp.StatusCode, replayed: info.Replayed, attempts: info.Attempts}
}

// chargeAll sends n operations through c from 8 goroutines and returns
// each one's result by operation.
func chargeAll(c *idemhttp.Client, url string, n int) map[string]result {
	var (
		mu      sync.Mutex
		results = make(map[string]result, n)
		ops     = make(chan string)
		wg      sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for op := range ops {
				r := charge(context.Background(), c, url, op)
				mu.Lock()
				results[op] = r
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		ops <- fmt.Sprintf("op-%03d", i)
	}
	close(ops)
	wg.Wait()
	return results
}

// TestClientUnderFaults: for every fault kind, 40 operations through the
// client each run exactly once and succeed. Each operation gets at most
// two faults and the client six attempts, so every one can finish.
func TestClientUnderFaults(t *testing.T) {
	const n = 40
	tests := []struct {
		name string
		give idemtest.Faults
		kind idemtest.FaultKind
	}{
		{"drop request", idemtest.Faults{DropRequest: 0.5}, idemtest.FaultDropRequest},
		{"drop response", idemtest.Faults{DropResponse: 0.5}, idemtest.FaultDropResponse},
		{"slow reply", idemtest.Faults{Slow: 0.3, SlowDelay: time.Hour}, idemtest.FaultSlow},
		{"503", idemtest.Faults{Unavailable: 0.5}, idemtest.FaultUnavailable},
		// A 409 comes only to a retry: after a lost response, as in life.
		{"409 bursts", idemtest.Faults{DropResponse: 0.5, Conflict: 0.5, ConflictBurst: 2}, idemtest.FaultConflict},
		{"all at once", idemtest.Faults{DropRequest: 0.1, DropResponse: 0.1, Slow: 0.05, SlowDelay: time.Hour, Unavailable: 0.1, Conflict: 0.1, ConflictBurst: 2}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.give.Seed = 2026
			tt.give.MaxPerOperation = 2
			srv := idemtest.NewServer(&idemtest.Options{Faults: tt.give})
			defer srv.Close()

			results := chargeAll(newClient(srv, idemhttp.Policy{}), srv.URL, n)

			st := srv.Stats()
			t.Logf("%s", st)
			assert.Zero(t, st.Duplicates, "no operation ran twice")
			for op, r := range results {
				require.NoError(t, r.err, "op %s", op)
				assert.Equal(t, http.StatusOK, r.status, "op %s", op)
				assert.Equal(t, 1, srv.Executions(op), "op %s ran once: not lost, not repeated", op)
			}
			assert.Len(t, results, n)
			if tt.kind != "" {
				assert.Positive(t, st.Faults[tt.kind], "the fault was injected")
			}
		})
	}
}

// TestClientDropResponseGetsReplay: when the reply to the work was lost,
// the retry is answered from the store and the client says so.
func TestClientDropResponseGetsReplay(t *testing.T) {
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{DropResponse: 1, MaxPerOperation: 1}})
	defer srv.Close()
	r := charge(context.Background(), newClient(srv, idemhttp.Policy{}), srv.URL, "op")
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusOK, r.status)
	assert.True(t, r.replayed)
	assert.Equal(t, 1, srv.Executions("op"))
}

// TestClientStoredFailure: a stored 500 is replayed, and the client returns
// it without retrying further: the failure is the operation's outcome.
func TestClientStoredFailure(t *testing.T) {
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{Seed: 5, Stored500: 0.5, MaxPerOperation: 1}})
	defer srv.Close()
	results := chargeAll(newClient(srv, idemhttp.Policy{}), srv.URL, 30)

	failed := 0
	for op, r := range results {
		require.NoError(t, r.err, "op %s", op)
		switch r.status {
		case http.StatusOK:
			assert.Equal(t, 1, srv.Executions(op), "op %s succeeded, so it ran once", op)
		case http.StatusInternalServerError:
			failed++
			assert.True(t, r.replayed, "op %s: the client stopped at the stored failure", op)
			assert.Equal(t, 2, r.attempts, "op %s: one retry, then the replay ends it", op)
			assert.Zero(t, srv.Executions(op), "op %s failed without side effects", op)
		default:
			t.Errorf("op %s: status %d", op, r.status)
		}
	}
	assert.Positive(t, failed)
	assert.Zero(t, srv.Stats().Duplicates)
}

// TestClientOutageThenRecovery: requests in an outage window get 503; the
// clock moves past the window while the client backs off, and every
// operation then completes once.
func TestClientOutageThenRecovery(t *testing.T) {
	clk := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	srv := idemtest.NewServer(&idemtest.Options{
		Now:    clk.Now,
		Faults: idemtest.Faults{Outages: []idemtest.Window{{Start: 0, End: time.Minute}}},
	})
	defer srv.Close()
	c := newClient(srv, idemhttp.Policy{})
	var once sync.Once
	c.Hooks = &idemtrace.Hooks{OnRetry: func(context.Context, idemtrace.RetryEvent) { once.Do(func() { clk.Advance(time.Hour) }) }}

	results := chargeAll(c, srv.URL, 10)

	for op, r := range results {
		require.NoError(t, r.err, "op %s", op)
		assert.Equal(t, 1, srv.Executions(op), "op %s", op)
	}
	assert.Positive(t, srv.Stats().Faults[idemtest.FaultOutage])
	assert.Zero(t, srv.Stats().Duplicates)
}

// TestClientFullOutage: nothing runs during an outage, every call ends in
// a give-up error, and the retry budget keeps the attempts near one per
// call once it drains.
func TestClientFullOutage(t *testing.T) {
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{Outages: []idemtest.Window{{Start: 0, End: 24 * time.Hour}}}})
	defer srv.Close()
	c := newClient(srv, idemhttp.Policy{})
	c.Policy.Budget = idemhttp.Budget{Capacity: 50} // drains after 10 retries
	const n = 100
	results := chargeAll(c, srv.URL, n)

	for op, r := range results {
		var giveUp *idemhttp.GiveUpError
		assert.ErrorAs(t, r.err, &giveUp, "op %s", op)
	}
	st := srv.Stats()
	t.Logf("full outage: %d requests for %d operations (%.2f per operation)", st.Requests, n, float64(st.Requests)/n)
	assert.Zero(t, st.Executions)
	assert.Less(t, st.Requests, n+n/2, "retries stop once the budget drains")
}

// TestClientSpeaksServerVariants checks the wire contract between the
// client and each server variant.
func TestClientSpeaksServerVariants(t *testing.T) {
	tests := []struct {
		name       string
		opts       idemtest.Options
		pol        idemhttp.Policy
		reuse      bool // send a second, different body with the first key (set by WithKey)
		wantErr    error
		wantStatus int
	}{
		{name: "IETF mismatch", reuse: true, wantErr: idemhttp.ErrKeyMismatch},
		{name: "Stripe mismatch", opts: idemtest.Options{StripeErrors: true}, pol: *idemhttp.StripePolicy(), reuse: true, wantErr: idemhttp.ErrKeyMismatch},
		{name: "key missing", opts: idemtest.Options{RequireKey: true}, pol: idemhttp.Policy{KeyMethods: []string{}}, wantErr: idemhttp.ErrKeyRequired},
		{name: "quoted key required and sent", opts: idemtest.Options{KeyForm: idemserver.KeyFormQuoted}, pol: idemhttp.Policy{QuoteKey: true}, wantStatus: 200},
		{name: "quoted key required, bare sent", opts: idemtest.Options{KeyForm: idemserver.KeyFormQuoted}, wantStatus: 400},
		{name: "bare key required and sent", opts: idemtest.Options{KeyForm: idemserver.KeyFormBare}, wantStatus: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := idemtest.NewServer(&tt.opts)
			defer srv.Close()
			c := newClient(srv, tt.pol)
			ctx := context.Background()
			if tt.reuse {
				ctx = idemhttp.WithKey(ctx, "key-1")
			}
			r := charge(ctx, c, srv.URL, "op")
			if tt.reuse {
				require.NoError(t, r.err)
				r = charge(ctx, c, srv.URL, "another-op")
			}
			if tt.wantErr != nil {
				assert.ErrorIs(t, r.err, tt.wantErr)
				return
			}
			require.NoError(t, r.err)
			assert.Equal(t, tt.wantStatus, r.status)
		})
	}
}

// TestClientConcurrentDuplicates: the same operation sent at once by many
// goroutines with one key runs once; the losers see 409 and retry into
// the replay.
func TestClientConcurrentDuplicates(t *testing.T) {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	c := newClient(srv, idemhttp.Policy{MaxAttempts: 20})
	ctx := idemhttp.WithKey(context.Background(), "same-key")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := charge(ctx, c, srv.URL, "op")
			if r.err == nil && r.status != http.StatusOK {
				r.err = fmt.Errorf("status %d", r.status)
			}
			errs <- r.err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, idemhttp.ErrInProgress) { // a 409 storm may outlast the attempts; never a duplicate
			assert.NoError(t, err)
		}
	}
	assert.Equal(t, 1, srv.Executions("op"))
}
