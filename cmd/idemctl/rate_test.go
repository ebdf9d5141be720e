package main

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeWaiter counts waits and fails them with err.
type fakeWaiter struct {
	waits atomic.Int64
	err   error
}

func (f *fakeWaiter) Wait(context.Context) error {
	f.waits.Add(1)
	return f.err
}

// Every attempt waits for the limiter, retries included: a rate-limited
// API counts each. A wait that fails sends nothing.
func TestCounterWaitsPerAttempt(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	w := &fakeWaiter{}
	c := &counter{rt: http.DefaultTransport, limiter: w}
	for range 3 {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/x", nil)
		require.NoError(t, err)
		resp, err := c.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	assert.Equal(t, int64(3), w.waits.Load())
	assert.Equal(t, int64(3), c.attempts.Load())

	w.err = errors.New("would exceed the deadline")
	before := srv.Stats().Requests
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader("amount=1"))
	require.NoError(t, err)
	_, err = c.RoundTrip(req)
	assert.ErrorContains(t, err, "waiting for -rate")
	assert.Equal(t, before, srv.Stats().Requests, "nothing sent")
	assert.Equal(t, int64(3), c.attempts.Load())
}

// -rate paces a real batch, retries included, and every charge still runs
// once. (Not timed: the pace itself is golang.org/x/time/rate's.)
func TestBatchRate(t *testing.T) {
	const n = 10
	srv := newServer(t, idemtest.Faults{Seed: 4, DropResponse: 0.3, MaxPerOperation: 1})
	dir := t.TempDir()
	in := writeInput(t, dir, n)

	out := runIn("batch", "-url", srv.URL, "-in", in, "-journal", filepath.Join(dir, "j"), "-rate", "500", "-progress", "none")

	require.Equal(t, exitOK, out.code, out.stderr)
	assertComplete(t, results(t, out.stdout), n)
	assertOnce(t, srv, n)
	assert.Nil(t, newLimiter(0), "0 means no limit")
	assert.NotNil(t, newLimiter(0.5))
}
