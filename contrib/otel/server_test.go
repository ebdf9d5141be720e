package otel_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	idemotel "github.com/idemkit/idemhttp/contrib/otel"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// serverRig is an idemserver handler inside a stand-in for otelhttp: a
// server span per request, in the request's context.
type serverRig struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	h      http.Handler
}

func newServerRig(t *testing.T, mw *idemserver.Middleware, app http.Handler, opts idemotel.Options) *serverRig {
	t.Helper()
	r := &serverRig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	opts.MeterProvider = mp
	inst, err := idemotel.NewServer(&opts)
	require.NoError(t, err)
	mw.Hooks = inst.Hooks()
	mw.Logger = slog.New(slog.DiscardHandler)
	inner := mw.Wrap(app)
	tracer := tp.Tracer("server")
	r.h = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ctx, sp := tracer.Start(req.Context(), req.Method, trace.WithSpanKind(trace.SpanKindServer))
		defer sp.End()
		inner.ServeHTTP(w, req.WithContext(ctx))
	})
	return r
}

func (r *serverRig) post(path, key, body string) int {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	r.h.ServeHTTP(w, req)
	return w.Code
}

// sums returns the int64 counter name's points keyed by attribute key.
func (r *serverRig) sums(t *testing.T, name string, key attribute.Key) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(key)
					out[v.String()] += p.Value
				}
			}
		}
	}
	return out
}

// eventAttrs returns the attributes of the span's events named name.
func eventAttrs(s sdktrace.ReadOnlySpan, name string) []map[attribute.Key]attribute.Value {
	var out []map[attribute.Key]attribute.Value
	for _, ev := range s.Events() {
		if ev.Name != name {
			continue
		}
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range ev.Attributes {
			m[kv.Key] = kv.Value
		}
		out = append(out, m)
	}
	return out
}

// serverApp answers 201, except 500 on /fail; on /block it waits for
// release after saying it has started.
type serverApp struct{ started, release chan struct{} }

func (a *serverApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/fail":
		w.WriteHeader(http.StatusInternalServerError)
		return
	case "/block":
		close(a.started)
		<-a.release
	}
	w.WriteHeader(http.StatusCreated)
}

// TestServerMetrics: claims are counted by outcome (new, replay, mismatch,
// in progress), releases by reason, store errors by operation, refusals by
// reason.
func TestServerMetrics(t *testing.T) {
	app := &serverApp{started: make(chan struct{}), release: make(chan struct{})}
	r := newServerRig(t, &idemserver.Middleware{SingleTenant: true, Store: &idemserver.MemoryStore{MaxEntries: 2}}, app, idemotel.Options{})

	assert.Equal(t, http.StatusCreated, r.post("/charges", "k1", "a"))
	assert.Equal(t, http.StatusCreated, r.post("/charges", "k1", "a"))             // replay
	assert.Equal(t, http.StatusUnprocessableEntity, r.post("/charges", "k1", "b")) // mismatch
	assert.Equal(t, http.StatusInternalServerError, r.post("/fail", "k2", ""))     // released
	done := make(chan int)
	go func() { done <- r.post("/block", "k3", "") }()
	<-app.started
	assert.Equal(t, http.StatusConflict, r.post("/block", "k3", ""))             // in progress
	assert.Equal(t, http.StatusServiceUnavailable, r.post("/charges", "k4", "")) // k1, k3 and k4's refused claim: full
	close(app.release)
	assert.Equal(t, http.StatusCreated, <-done)

	assert.Equal(t, map[string]int64{"new": 3, "replay": 1, "mismatch": 1, "in_progress": 1},
		r.sums(t, "idemhttp.server.claims", idemotel.ClaimOutcomeAttr))
	assert.Equal(t, map[string]int64{"true": 2}, r.sums(t, "idemhttp.server.stored", idemotel.ReplayableAttr))
	assert.Equal(t, map[string]int64{"server_error": 1}, r.sums(t, "idemhttp.server.releases", idemotel.ReleaseReasonAttr))
	assert.Equal(t, map[string]int64{"store_full": 1}, r.sums(t, "idemhttp.server.refusals", idemotel.RefusalReasonAttr))
	assert.Equal(t, map[string]int64{"POST": 6}, r.sums(t, "idemhttp.server.claims", "http.request.method"))
}

// failingStore fails every Claim.
type failingStore struct{ *idemserver.MemoryStore }

func (failingStore) Claim(context.Context, string, idemserver.Claim) (idemserver.ClaimResult, error) {
	return idemserver.ClaimResult{}, errors.New("store down")
}

// TestServerStoreErrors: a failing store is counted by operation and
// recorded as an error on the server span.
func TestServerStoreErrors(t *testing.T) {
	r := newServerRig(t, &idemserver.Middleware{SingleTenant: true, Store: failingStore{new(idemserver.MemoryStore)}}, &serverApp{}, idemotel.Options{})
	assert.Equal(t, http.StatusServiceUnavailable, r.post("/charges", "k1", ""))
	assert.Equal(t, map[string]int64{"claim": 1}, r.sums(t, "idemhttp.server.store.errors", idemotel.StoreOpAttr))
	spans := r.spans.Ended()
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Error, spans[0].Status().Code)
	require.Len(t, eventAttrs(spans[0], "idemhttp.store_error"), 1)
	require.Len(t, eventAttrs(spans[0], "exception"), 1)
}

// TestServerSpanEvents: decisions are events on the request's server
// span (none is started), the key and scope only when allowed.
func TestServerSpanEvents(t *testing.T) {
	for _, tt := range []struct {
		name   string
		give   idemotel.Options
		wantID bool
	}{{name: "default"}, {name: "recorded", give: idemotel.Options{RecordKey: true, RecordScope: true}, wantID: true}} {
		t.Run(tt.name, func(t *testing.T) {
			mw := &idemserver.Middleware{Principal: func(*http.Request) string { return "acme" }}
			r := newServerRig(t, mw, &serverApp{}, tt.give)
			r.post("/charges", "k1", "")
			r.post("/charges", "k1", "")
			spans := r.spans.Ended()
			require.Len(t, spans, 2, "one server span per request, none of ours")

			first, replay := spans[0], spans[1]
			assert.Equal(t, "new", attrs(first)[idemotel.ClaimOutcomeAttr].AsString())
			assert.False(t, attrs(first)[idemotel.ReplayedAttr].AsBool())
			claims := eventAttrs(first, "idemhttp.claim")
			require.Len(t, claims, 1)
			require.Len(t, eventAttrs(first, "idemhttp.stored"), 1)
			assert.Equal(t, "replay", attrs(replay)[idemotel.ClaimOutcomeAttr].AsString())
			assert.True(t, attrs(replay)[idemotel.ReplayedAttr].AsBool())

			key, hasKey := claims[0][idemotel.KeyAttr]
			scope, hasScope := claims[0][idemotel.ScopeAttr]
			assert.Equal(t, tt.wantID, hasKey)
			assert.Equal(t, tt.wantID, hasScope)
			if tt.wantID {
				assert.Equal(t, "k1", key.AsString())
				assert.Equal(t, "acme", scope.AsString())
			}
		})
	}
}

// TestServerWithoutSpan: with no span in the context the hooks count and
// do nothing else.
func TestServerWithoutSpan(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	inst, err := idemotel.NewServer(&idemotel.Options{MeterProvider: mp})
	require.NoError(t, err)
	h := (&idemserver.Middleware{SingleTenant: true, Hooks: inst.Hooks(), LockTimeout: time.Minute}).Wrap(&serverApp{})
	req := httptest.NewRequest(http.MethodPost, "/charges", nil)
	req.Header.Set("Idempotency-Key", "k1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	assert.Equal(t, http.StatusCreated, w.Code)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	require.NotEmpty(t, rm.ScopeMetrics)
}
