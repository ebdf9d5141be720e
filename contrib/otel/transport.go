package otel

import (
	"net/http"

	otelapi "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Transport returns a RoundTripper that sends each attempt through rt with
// the attempt span's trace context in its headers (traceparent, with the
// W3C propagator), so the server's spans join the attempt's. p nil means
// otel.GetTextMapPropagator() (a no-op until one is set). rt nil means
// http.DefaultTransport. Use it as the Transport of the client's
// HTTPClient:
//
//	c := &idemhttp.Client{HTTPClient: &http.Client{Transport: inst.Transport(nil, nil)}}
//
// The request is cloned before its headers change, as the RoundTripper
// contract asks. A request that does not come from an instrumented call
// passes through untouched.
//
// One difference follows from wrapping: the client no longer sees a
// net/http Transport, so a request that net/http refuses before
// connecting (an invalid header, an unsupported scheme) is taken as
// outcome unknown rather than as permanent: it is retried when that is
// safe (a key or an idempotent method) and returned otherwise, never
// resent unsafely.
func (in *Instrumentation) Transport(rt http.RoundTripper, p propagation.TextMapPropagator) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &propagating{rt: rt, p: p}
}

type propagating struct {
	rt http.RoundTripper
	p  propagation.TextMapPropagator
}

func (t *propagating) RoundTrip(r *http.Request) (*http.Response, error) {
	c := callFrom(r.Context())
	if c == nil || c.attempt == nil {
		return t.rt.RoundTrip(r)
	}
	p := t.p
	if p == nil {
		p = otelapi.GetTextMapPropagator()
	}
	out := r.Clone(r.Context())
	p.Inject(trace.ContextWithSpan(r.Context(), c.attempt), propagation.HeaderCarrier(out.Header))
	return t.rt.RoundTrip(out)
}

// CloseIdleConnections closes the wrapped transport's idle connections.
func (t *propagating) CloseIdleConnections() {
	if ci, ok := t.rt.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}
