package otel

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/idemhttp/idemserver"
	otelapi "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of the server's spans and metrics.
const (
	ScopeAttr         = attribute.Key("idemhttp.scope") // only with Options.RecordScope
	ClaimOutcomeAttr  = attribute.Key("idemhttp.claim.outcome")
	ReleaseReasonAttr = attribute.Key("idemhttp.release.reason")
	StoreOpAttr       = attribute.Key("idemhttp.store.op")
	RefusalReasonAttr = attribute.Key("idemhttp.refusal.reason")
	ClaimLostAttr     = attribute.Key("idemhttp.claim.lost")
	ReplayableAttr    = attribute.Key("idemhttp.replayable")
)

// ServerInstrumentation holds the instruments for [idemserver.Middleware]
// handlers. Create it with [NewServer]; set what
// [ServerInstrumentation.Hooks] returns as the Middleware's Hooks before
// Wrap or Handler. One ServerInstrumentation may serve many Middleware.
//
// It starts no spans: the server span is the one an HTTP server
// instrumentation (otelhttp.NewHandler, outside the middleware) put in the
// request's context. When there is one and it is recording, each decision
// adds an event to it (idemhttp.claim, idemhttp.stored, idemhttp.released,
// idemhttp.renew_failed, idemhttp.store_error, idemhttp.refused) and the
// claim's outcome as an attribute; store errors are recorded as errors.
type ServerInstrumentation struct {
	opts  Options
	hooks idemserver.Hooks

	claims, stored, releases, renewFailures, storeErrors, refusals metric.Int64Counter
	claimDuration                                                  metric.Float64Histogram
}

// NewServer creates the instruments for idemserver middleware. Only
// opts.MeterProvider, RecordKey and RecordScope are used (no spans are
// started, so no TracerProvider). opts may be nil.
func NewServer(opts *Options) (*ServerInstrumentation, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	mp := o.MeterProvider
	if mp == nil {
		mp = otelapi.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	s := &ServerInstrumentation{opts: o}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{"+unit+"}"))
		errs = append(errs, err)
		return c
	}
	s.claims = counter("idemhttp.server.claims", "claim", "keyed requests by what their claim found: new, in_progress (409), replay, mismatch (422), not_replayable (410)")
	s.stored = counter("idemhttp.server.stored", "response", "responses stored for replays")
	s.releases = counter("idemhttp.server.releases", "release", "claimed keys released so that a retry runs again, by reason")
	s.renewFailures = counter("idemhttp.server.renewal.failures", "failure", "failed renewals of a running handler's claim")
	s.storeErrors = counter("idemhttp.server.store.errors", "error", "store failures, by operation")
	s.refusals = counter("idemhttp.server.refusals", "refusal", "requests refused before the store was asked, by reason")
	var err error
	s.claimDuration, err = m.Float64Histogram("idemhttp.server.claim.duration",
		metric.WithDescription("time the store took to answer a claim"), metric.WithUnit("s"))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idemhttp/contrib/otel: server instruments: %w", err)
	}
	s.hooks = idemserver.Hooks{
		RecordScope:   o.RecordScope,
		RecordKey:     o.RecordKey,
		OnClaim:       s.claim,
		OnStored:      s.storedResponse,
		OnReleased:    s.released,
		OnRenewFailed: s.renewFailed,
		OnStoreError:  s.storeError,
		OnRefused:     s.refused,
	}
	return s, nil
}

// Hooks returns the hooks to set as [idemserver.Middleware.Hooks]. Each
// call returns a new copy, which the caller may extend.
func (s *ServerInstrumentation) Hooks() *idemserver.Hooks {
	h := s.hooks
	return &h
}

// span returns the request's recording server span, or nil.
func span(ctx context.Context) trace.Span {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		return sp
	}
	return nil
}

// spanAttrs returns the identity attributes the options allow on a span.
func spanAttrs(ev idemserver.RequestEvent, more ...attribute.KeyValue) []attribute.KeyValue {
	if ev.Key != "" {
		more = append(more, KeyAttr.String(ev.Key))
	}
	if ev.Scope != "" {
		more = append(more, ScopeAttr.String(ev.Scope))
	}
	return more
}

func method(ev idemserver.RequestEvent) attribute.KeyValue {
	return semconv.HTTPRequestMethodKey.String(ev.Method)
}

func (s *ServerInstrumentation) claim(ctx context.Context, ev idemserver.ClaimEvent) {
	outcome := ClaimOutcomeAttr.String(string(ev.Outcome))
	set := metric.WithAttributes(method(ev.RequestEvent), outcome)
	s.claims.Add(ctx, 1, set)
	s.claimDuration.Record(ctx, ev.Latency.Seconds(), set)
	if sp := span(ctx); sp != nil {
		sp.SetAttributes(outcome, ReplayedAttr.Bool(ev.Outcome == idemserver.ClaimReplay))
		sp.AddEvent("idemhttp.claim", trace.WithAttributes(spanAttrs(ev.RequestEvent, outcome)...))
	}
}

func (s *ServerInstrumentation) storedResponse(ctx context.Context, ev idemserver.StoredEvent) {
	replayable := ReplayableAttr.Bool(ev.Replayable)
	s.stored.Add(ctx, 1, metric.WithAttributes(method(ev.RequestEvent), replayable))
	if sp := span(ctx); sp != nil {
		sp.AddEvent("idemhttp.stored", trace.WithAttributes(spanAttrs(ev.RequestEvent, replayable, semconv.HTTPResponseStatusCode(ev.Status))...))
	}
}

func (s *ServerInstrumentation) released(ctx context.Context, ev idemserver.ReleasedEvent) {
	reason := ReleaseReasonAttr.String(string(ev.Reason))
	s.releases.Add(ctx, 1, metric.WithAttributes(method(ev.RequestEvent), reason))
	if sp := span(ctx); sp != nil {
		attrs := spanAttrs(ev.RequestEvent, reason)
		if ev.Status != 0 {
			attrs = append(attrs, semconv.HTTPResponseStatusCode(ev.Status))
		}
		sp.AddEvent("idemhttp.released", trace.WithAttributes(attrs...))
	}
}

func (s *ServerInstrumentation) renewFailed(ctx context.Context, ev idemserver.RenewFailedEvent) {
	lost := ClaimLostAttr.Bool(ev.Lost)
	s.renewFailures.Add(ctx, 1, metric.WithAttributes(method(ev.RequestEvent), lost))
	if sp := span(ctx); sp != nil {
		sp.AddEvent("idemhttp.renew_failed", trace.WithAttributes(spanAttrs(ev.RequestEvent, lost)...))
	}
}

func (s *ServerInstrumentation) storeError(ctx context.Context, ev idemserver.StoreErrorEvent) {
	op := StoreOpAttr.String(string(ev.Op))
	s.storeErrors.Add(ctx, 1, metric.WithAttributes(method(ev.RequestEvent), op))
	if sp := span(ctx); sp != nil {
		sp.AddEvent("idemhttp.store_error", trace.WithAttributes(spanAttrs(ev.RequestEvent, op)...))
		sp.RecordError(ev.Err, trace.WithAttributes(op))
		sp.SetStatus(codes.Error, "idempotency store "+string(ev.Op)+" failed")
	}
}

func (s *ServerInstrumentation) refused(ctx context.Context, ev idemserver.RefusedEvent) {
	reason := RefusalReasonAttr.String(string(ev.Reason))
	s.refusals.Add(ctx, 1, metric.WithAttributes(method(ev.RequestEvent), reason))
	if sp := span(ctx); sp != nil {
		sp.AddEvent("idemhttp.refused", trace.WithAttributes(spanAttrs(ev.RequestEvent, reason)...))
	}
}
