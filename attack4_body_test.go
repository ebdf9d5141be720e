package idemhttp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemtrace"
)

// The fresh-eyes attack on the last fixes of the previous session
// (attack4): proceed's deferred close of a streamed body on a panic.

// trackedBodies hands out bodies (the request's, then GetBody's) and
// counts those never closed: a caller streaming through an io.Pipe has
// a writer blocked on each.
type trackedBodies struct {
	mu     sync.Mutex
	bodies []*trackedBody
}

type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

func (tb *trackedBodies) next() (io.ReadCloser, error) {
	b := &trackedBody{Reader: strings.NewReader(chargeBody)}
	tb.mu.Lock()
	tb.bodies = append(tb.bodies, b)
	tb.mu.Unlock()
	return b, nil
}

func (tb *trackedBodies) open() (open, all int) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, b := range tb.bodies {
		if !b.closed.Load() {
			open++
		}
	}
	return open, len(tb.bodies)
}

// TestPanicOnALaterAttemptClosesItsStreamedBody: a call with a streamed
// body (GetBody, unknown length) whose second attempt's OnAttempt hook
// (or Pacer.Wait) panics. The engine takes the attempt's body from
// GetBody before it runs the hook; the panic left that body open, since
// proceed's deferred close closed only the first attempt's: a caller
// streaming through an io.Pipe had its writer blocked for ever.
//
// Checked to fail with proceed's deferred close of stream.last removed:
// one body of two stayed open, in both cases.
func TestPanicOnALaterAttemptClosesItsStreamedBody(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable) // retried: the call is keyed
	}))
	defer srv.Close()
	for _, tt := range []struct {
		name string
		c    func() *Client
	}{
		{"OnAttempt", func() *Client {
			return &Client{Policy: fast(), Hooks: &idemtrace.Hooks{OnAttempt: func(_ context.Context, ev idemtrace.AttemptEvent) {
				if ev.Attempt == 2 {
					panic("metrics bug")
				}
			}}}
		}},
		{"Pacer.Wait", func() *Client {
			p := fast()
			p.Pacer = &panickyPacer{}
			return &Client{Policy: p}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var tb trackedBodies
			body, _ := tb.next()
			req, err := http.NewRequest(http.MethodPost, srv.URL, body)
			require.NoError(t, err)
			req.ContentLength = -1 // unknown: streamed, not buffered
			req.GetBody = tb.next
			require.Panics(t, func() { _, _ = tt.c().Do(req) })
			// The transport closes a body it was handed on its own
			// goroutine: give it time.
			deadline := time.Now().Add(2 * time.Second)
			open, all := tb.open()
			for open > 0 && time.Now().Before(deadline) {
				<-time.After(5 * time.Millisecond)
				open, all = tb.open()
			}
			assert.Zero(t, open, "bodies left open, of %d", all)
		})
	}
}

// panickyPacer lets the first attempt go and panics on the second.
type panickyPacer struct{ n atomic.Int32 }

func (p *panickyPacer) Wait(context.Context) error {
	if p.n.Add(1) == 2 {
		panic("pacer bug")
	}
	return nil
}

func (p *panickyPacer) Observe(int, bool) {}

// countingBody counts its Close calls.
type countingBody struct {
	io.Reader
	closes atomic.Int32
}

func (b *countingBody) Close() error { b.closes.Add(1); return nil }

// lateCloser is a caller's RoundTripper that answers 503 at once and
// closes the request's body later, on a goroutine of its own, as
// RoundTripper's contract allows.
type lateCloser struct{ closed chan struct{} }

func (l lateCloser) RoundTrip(r *http.Request) (*http.Response, error) {
	go func() {
		<-time.After(50 * time.Millisecond)
		_ = r.Body.Close()
		close(l.closed)
	}()
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// TestPanicClosesAStreamedBodyOnce: a hook that panics after an attempt
// (OnAttemptDone) while the transport still holds the attempt's streamed
// body: proceed's deferred close closes it, then the transport closes
// it, as it must. The caller's body was closed twice: a Close that is not
// idempotent (a pooled buffer given back twice) breaks.
//
// Checked to fail with verifyingBody.Close closing its source every
// time: two closes.
func TestPanicClosesAStreamedBodyOnce(t *testing.T) {
	body := &countingBody{Reader: strings.NewReader(chargeBody)}
	req, err := http.NewRequest(http.MethodPost, "http://api.invalid/charges", body)
	require.NoError(t, err)
	req.ContentLength = -1 // unknown: streamed, not buffered
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(chargeBody)), nil }
	rt := lateCloser{closed: make(chan struct{})}
	c := &Client{HTTPClient: &http.Client{Transport: rt}, Policy: fast(), Hooks: &idemtrace.Hooks{
		OnAttemptDone: func(context.Context, idemtrace.AttemptDoneEvent) { panic("metrics bug") },
	}}
	require.Panics(t, func() { _, _ = c.Do(req) })
	<-rt.closed
	assert.Equal(t, int32(1), body.closes.Load(), "the caller's body was closed more than once")
}
