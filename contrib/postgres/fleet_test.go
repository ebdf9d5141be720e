package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idemhttp/internal/storeharness"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// The fleet test runs worker processes (this test binary, re-executed)
// that share one batch in a PostgreSQL journal, kills one mid-request,
// and checks that every operation ran exactly once.

// Environment of a worker process.
const (
	fleetURLEnv    = "IDEMTEST_FLEET_URL"    // connection string
	fleetSchemaEnv = "IDEMTEST_FLEET_SCHEMA" // the test's schema
	fleetServerEnv = "IDEMTEST_FLEET_SERVER" // base URL of the API
	fleetWorkerEnv = "IDEMTEST_FLEET_WORKER" // worker name
)

// fleetLease is the workers' lease: a killed worker's entries wait this
// long before another worker resends them.
const fleetLease = time.Second

// TestFleetWorker is a worker process of TestFleet; it is skipped unless
// TestFleet started it.
func TestFleetWorker(t *testing.T) {
	url, server, worker := os.Getenv(fleetURLEnv), os.Getenv(fleetServerEnv), os.Getenv(fleetWorkerEnv)
	if url == "" {
		t.Skip("helper process: run by TestFleet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := (&testSchema{url: url, name: os.Getenv(fleetSchemaEnv)}).pool(t, 2)
	j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: worker, Lease: fleetLease})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &idemhttp.Client{
		HTTPClient: &http.Client{Transport: tr, Timeout: 5 * time.Second},
		Journal:    j,
		Policy: &idemhttp.Policy{
			MaxAttempts: 20, BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond,
			Budget: idemhttp.Budget{Disabled: true},
		},
		PrepareRequest: func(r *http.Request) error {
			r.Header.Set("X-Worker", worker)
			return nil
		},
	}
	require.True(t, strings.HasPrefix(server, "http://"))
	require.NoError(t, work(ctx, j, c))
}

// work is a worker's loop: claim a few pending entries, send each, and
// stop when no entry is pending, leased or not.
func work(ctx context.Context, j *postgres.Journal, c *idemhttp.Client) error {
	for {
		entries, err := j.ClaimPending(ctx, 4)
		if err != nil {
			return err
		}
		if len(entries) == 0 {
			pending, err := j.Pending(ctx)
			if err != nil || len(pending) == 0 {
				return err
			}
			// Entries leased by other workers, alive or dead: look again
			// soon. (A production loop might LISTEN for a NOTIFY instead.)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		for _, e := range entries {
			if err := resend(ctx, j, c, e); err != nil {
				return err
			}
		}
	}
}

// resend sends a claimed entry through c with its own key, operation and
// body; c's journal records the outcome, which ends the lease. It returns
// an error only when the journal fails; a failed call leaves the entry
// pending, and another claim retries it once the lease expires.
func resend(ctx context.Context, j *postgres.Journal, c *idemhttp.Client, e *idemhttp.Entry) error {
	rctx := idemhttp.WithKey(ctx, e.Key)
	if e.Operation != "" {
		rctx = idemhttp.WithOperation(rctx, e.Operation)
	}
	req, err := http.NewRequestWithContext(rctx, e.Method, e.URL, bytes.NewReader(e.Body))
	if err != nil {
		return j.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateAbandoned})
	}
	for name, vals := range e.Header {
		req.Header[name] = vals
	}
	resp, err := c.Do(req)
	switch {
	case errors.Is(err, idemhttp.ErrKeyExpired):
		// The server has forgotten the key: resending could run the
		// operation twice. Leave it to a person.
		return j.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateAbandoned})
	case err != nil:
		return nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// victim tracks requests from the worker the test kills: after a few, the
// next one is held in the handler until the worker is dead.
type victim struct {
	name    string
	after   int
	mu      sync.Mutex
	seen    int
	holding chan struct{} // closed when a request is held
	killed  chan struct{} // closed by the test once the worker is dead
}

func (v *victim) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Worker") == v.name {
			v.mu.Lock()
			v.seen++
			hold := v.seen == v.after
			v.mu.Unlock()
			if hold {
				close(v.holding)
				<-v.killed
			}
		}
		h.ServeHTTP(w, r)
	})
}

func TestFleet(t *testing.T) {
	const (
		workers = 4
		ops     = 120
	)
	s := newSchema(t)
	e := storeharness.NewEffects()
	v := &victim{name: "worker-0", after: 5, holding: make(chan struct{}), killed: make(chan struct{})}
	var killOnce sync.Once
	markKilled := func() { killOnce.Do(func() { close(v.killed) }) }
	defer markKilled()
	// The effect runs inside the middleware, after the hold: the killed
	// worker's request completes on the server, and its response is
	// stored for whoever resends it.
	mw := &idemserver.Middleware{SingleTenant: true, Required: true}
	srv := httptest.NewServer(v.wrap(mw.Wrap(e)))
	t.Cleanup(srv.Close)

	ctx := context.Background()
	producer := postgres.NewJournal(s.pool(t, 0), nil)
	url := srv.URL + "/charges"
	for i := range ops {
		op := fmt.Sprintf("op-%03d", i)
		body := []byte(op)
		existing, err := producer.Enqueue(ctx, &idemhttp.Entry{
			Operation: op,
			Key:       idemhttp.NewKey(),
			Method:    http.MethodPost,
			URL:       url,
			Header:    http.Header{"Content-Type": {"text/plain"}},
			Body:      body,
		})
		require.NoError(t, err)
		require.Nil(t, existing)
	}

	cmds := make([]*exec.Cmd, workers)
	outs := make([]*bytes.Buffer, workers)
	exited := make([]chan error, workers)
	reaped := make([]bool, workers)
	reap := func(i int) error {
		reaped[i] = true
		return <-exited[i]
	}
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFleetWorker$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), fleetURLEnv+"="+s.url, fleetSchemaEnv+"="+s.name,
			fleetServerEnv+"="+srv.URL, fleetWorkerEnv+"="+fmt.Sprint("worker-", i))
		outs[i] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		require.NoError(t, cmd.Start())
		cmds[i], exited[i] = cmd, make(chan error, 1)
		go func() { exited[i] <- cmd.Wait() }()
	}
	// On any failure below, no worker outlives the test.
	defer func() {
		for i, cmd := range cmds {
			if !reaped[i] {
				_ = cmd.Process.Kill()
				_ = reap(i)
			}
		}
	}()

	select {
	case <-v.holding:
	case err := <-exited[0]:
		reaped[0] = true
		require.FailNow(t, "worker-0 exited before it was killed", "%v:\n%s", err, outs[0])
	case <-time.After(45 * time.Second):
		require.FailNow(t, "worker-0 never made its request")
	}
	require.NoError(t, cmds[0].Process.Kill()) // SIGKILL, mid-request
	err := reap(0)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.False(t, exit.Exited(), "worker-0 died of its signal")
	markKilled()

	for i := 1; i < workers; i++ {
		select {
		case err := <-exited[i]:
			reaped[i] = true
			assert.NoError(t, err, "worker-%d:\n%s", i, outs[i])
		case <-time.After(45 * time.Second):
			require.FailNow(t, "a worker did not finish", "worker-%d", i)
		}
	}

	duplicates, lost := 0, 0
	for i := range ops {
		switch n := e.Count(fmt.Sprintf("op-%03d", i)); {
		case n == 0:
			lost++
		case n > 1:
			duplicates += n - 1
		}
	}
	assert.Zero(t, duplicates, "operations run more than once")
	assert.Zero(t, lost, "operations never run")

	pending, err := producer.Pending(ctx)
	require.NoError(t, err)
	assert.Empty(t, keysOf(pending))
	var done int
	require.NoError(t, s.admin(t).QueryRow(ctx,
		"SELECT count(*) FROM "+s.name+".idemhttp_journal WHERE state = 'done'").Scan(&done))
	assert.Equal(t, ops, done)
}

// TestFleetStaleCreator is issue 22 §2b.1 end to end, with real Clients:
// worker A begins an operation, and its PrepareRequest stalls past A's
// lease; worker B claims the entry and sends it; then A's PrepareRequest
// fails, so A's call sent nothing and withdraws "its" entry. The journal
// refuses (ErrFenced), so the caller's retry of the operation reuses the
// key and the operation runs once, whatever B did meanwhile: finished it,
// still sending it under a live lease, or sent it and died (its lease
// expired). Checked to fail with deleteSQL's token clause removed: A's
// withdrawal then succeeded and the caller's retry ran the operation a
// second time, in each case.
func TestFleetStaleCreator(t *testing.T) {
	tests := []struct {
		name string
		b    string // what B does before A's call fails: "finish", "send", "send-and-die"
	}{
		{name: "B finished it", b: "finish"},
		{name: "B is sending it", b: "send"},
		{name: "B sent it and died", b: "send-and-die"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := newSchema(t)
			ja, jb, shift := fleet(t, s)
			e := storeharness.NewEffects()
			mw := &idemserver.Middleware{SingleTenant: true, Required: true}
			srv := httptest.NewServer(mw.Wrap(e))
			t.Cleanup(srv.Close)
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)
			hc := &http.Client{Transport: tr}

			entered, release := make(chan struct{}), make(chan struct{})
			var stall atomic.Bool
			stall.Store(true)
			ca := &idemhttp.Client{HTTPClient: hc, Journal: ja, PrepareRequest: func(*http.Request) error {
				if !stall.Load() {
					return nil
				}
				close(entered)
				<-release
				return errors.New("credentials unavailable")
			}}
			cb := &idemhttp.Client{HTTPClient: hc, Journal: jb}
			do := func(c *idemhttp.Client) error {
				req, err := http.NewRequestWithContext(idemhttp.WithOperation(ctx, "op-1"), http.MethodPost, srv.URL+"/charges", strings.NewReader("op-1"))
				if err != nil {
					return err
				}
				resp, err := c.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
				return err
			}

			first := make(chan error, 1)
			go func() { first <- do(ca) }()
			<-entered
			shift(2 * time.Minute) // A's lease expires while its PrepareRequest stalls
			claimed, err := jb.ClaimPending(ctx, 10)
			require.NoError(t, err)
			require.Len(t, claimed, 1)
			key := claimed[0].Key
			switch tt.b {
			case "finish":
				res, err := cb.Resume(ctx, &idemhttp.ResumeOptions{Entries: claimed})
				require.NoError(t, err)
				require.NoError(t, res[0].Err)
			case "send", "send-and-die":
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader("op-1"))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", key)
				resp, err := hc.Do(req)
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusCreated, resp.StatusCode)
				if tt.b == "send-and-die" {
					shift(2 * time.Minute)
				}
			}
			require.Equal(t, 1, e.Count("op-1"))

			close(release)
			require.Error(t, <-first, "A's call failed before sending")
			got, err := ja.Get(ctx, key)
			require.NoError(t, err, "the entry B sent is still there")
			t.Logf("after A's withdrawal: %s", got.State)

			// The caller retries the operation: same key, nothing runs twice.
			stall.Store(false)
			if tt.b != "finish" {
				shift(2 * time.Minute) // B's lease, if any, has expired: A may resend
			}
			err = do(ca)
			var done *idemhttp.DoneError
			switch {
			case err == nil, errors.As(err, &done):
			default:
				// An entry left abandoned (the client's fallback, see
				// the report) is refused too; never resent under a new key.
				assert.ErrorIs(t, err, idemhttp.ErrKeyExpired)
			}
			assert.Equal(t, 1, e.Count("op-1"), "the operation ran twice")
			again, err := ja.Lookup(ctx, "op-1")
			require.NoError(t, err)
			assert.Equal(t, key, again.Key, "the operation kept its key")
		})
	}
}
