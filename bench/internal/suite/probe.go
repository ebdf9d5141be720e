package suite

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
)

// probe counts, for one operation, the attempts its client made and the
// requests net/http resent by itself within those attempts.
//
// net/http's Transport resends a request once, inside a single RoundTrip,
// when a reused pooled connection turns out dead before any response byte
// arrives and the request is replayable, which includes any POST carrying
// an Idempotency-Key header (see net/http.Transport). The client never
// sees it, so the client's attempt count undercounts what the server
// receives; the suite reports those resends separately.
type probe struct {
	attempts atomic.Int64 // RoundTrip calls: the client's own attempts
	resends  atomic.Int64 // extra connections taken within one RoundTrip
}

type probeCtxKey struct{}

// withProbe returns ctx carrying p, for countingTransport to find.
func withProbe(ctx context.Context, p *probe) context.Context {
	return context.WithValue(ctx, probeCtxKey{}, p)
}

// countingTransport counts attempts and silent resends into the probe
// riding in each request's context. Requests without one pass through.
type countingTransport struct{ t *http.Transport }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	p, _ := r.Context().Value(probeCtxKey{}).(*probe)
	if p == nil {
		return c.t.RoundTrip(r)
	}
	p.attempts.Add(1)
	// GotConn fires once per connection the Transport takes for this
	// request: a second one within the same RoundTrip is a resend.
	var conns atomic.Int64
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { conns.Add(1) }}
	resp, err := c.t.RoundTrip(r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
	if n := conns.Load(); n > 1 {
		p.resends.Add(n - 1)
	}
	return resp, err
}

// CloseIdleConnections passes through, so that a client that closes its
// idle connections (go-retryablehttp does after every failure) behaves as
// it would on the bare Transport.
func (c countingTransport) CloseIdleConnections() { c.t.CloseIdleConnections() }
