package otel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	idemotel "github.com/idemkit/idemhttp/contrib/otel"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// statuses answers the n-th request with the n-th status (the last
// repeats).
func statuses(t *testing.T, codes ...int) *httptest.Server {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		i := int(n.Add(1)) - 1
		w.WriteHeader(codes[min(i, len(codes)-1)])
	}))
	t.Cleanup(srv.Close)
	return srv
}

type rig struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	client *idemhttp.Client
	inst   *idemotel.Instrumentation
}

func newRig(t *testing.T, pol *idemhttp.Policy, opts idemotel.Options) *rig {
	t.Helper()
	r := &rig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() {
		_ = r.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	opts.TracerProvider, opts.MeterProvider = r.tp, mp
	r.client = &idemhttp.Client{Policy: pol}
	inst, err := idemotel.New(r.client, &opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, inst.Close()) })
	r.inst = inst
	r.client.Hooks = inst.Hooks()
	return r
}

func fast() *idemhttp.Policy {
	return &idemhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
}

func (r *rig) post(t *testing.T, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":1000}`))
	require.NoError(t, err)
	resp, err := r.client.Do(req)
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// sums returns the data points of the int64 counter name, keyed by the
// value of attribute key ("" for all points together).
func (r *rig) sums(t *testing.T, name string, key attribute.Key) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			var points []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				points = d.DataPoints
			case metricdata.Gauge[int64]:
				points = d.DataPoints
			}
			for _, p := range points {
				v, _ := p.Attributes.Value(key)
				out[v.String()] += p.Value
			}
		}
	}
	return out
}

func TestTraceOfACallThatRetriedTwice(t *testing.T) {
	srv := statuses(t, 503, 500, 201)
	r := newRig(t, fast(), idemotel.Options{})
	parentCtx, parent := r.tp.Tracer("test").Start(context.Background(), "checkout")
	_, err := r.post(t, parentCtx, srv.URL+"/v1/charges?api_key=sk_live_secret")
	require.NoError(t, err)
	parent.End()

	ended := r.spans.Ended()
	require.Len(t, ended, 5, "three attempts, the call, the caller's span")
	var call sdktrace.ReadOnlySpan
	var tries []sdktrace.ReadOnlySpan
	for _, s := range ended {
		switch s.SpanKind() {
		case trace.SpanKindInternal:
			if s.Name() == "idemhttp POST" {
				call = s
			}
		case trace.SpanKindClient:
			tries = append(tries, s)
		}
	}
	require.NotNil(t, call)
	require.Len(t, tries, 3)
	assert.Equal(t, parent.SpanContext().SpanID(), call.Parent().SpanID(), "the call is a child of the caller's span")
	ca := attrs(call)
	assert.Equal(t, int64(3), ca["idemhttp.attempts"].AsInt64())
	assert.Equal(t, int64(201), ca["http.response.status_code"].AsInt64())
	assert.NotContains(t, ca, idemotel.KeyAttr, "no key unless allowed")
	assert.Contains(t, ca["url.full"].AsString(), "api_key=REDACTED")
	assert.NotContains(t, ca["url.full"].AsString(), "sk_live_secret")

	wantStatus := []int64{503, 500, 201}
	wantReason := []string{"unavailable", "server_error", ""}
	for i, s := range tries {
		a := attrs(s)
		assert.Equal(t, "POST", s.Name())
		assert.Equal(t, call.SpanContext().SpanID(), s.Parent().SpanID(), "attempt %d is a child of the call", i+1)
		assert.Equal(t, "POST", a["http.request.method"].AsString())
		assert.Equal(t, wantStatus[i], a["http.response.status_code"].AsInt64())
		assert.Equal(t, wantReason[i], a["idemhttp.retry.reason"].AsString(), "attempt %d", i+1)
		assert.NotContains(t, a["url.full"].AsString(), "sk_live_secret")
		if i == 0 {
			assert.NotContains(t, a, attribute.Key("http.request.resend_count"), "the first attempt is not a resend")
		} else {
			assert.Equal(t, int64(i), a["http.request.resend_count"].AsInt64())
		}
		if wantStatus[i] >= 500 {
			assert.Equal(t, codes.Error, s.Status().Code)
			assert.Equal(t, "5", a["error.type"].AsString()[:1])
		}
		assert.False(t, s.EndTime().Before(s.StartTime()))
	}

	assert.Equal(t, map[string]int64{"": 3}, r.sums(t, "idemhttp.client.attempts", ""))
	assert.Equal(t, map[string]int64{"unavailable": 1, "server_error": 1}, r.sums(t, "idemhttp.client.retries", idemotel.RetryReasonAttr))
	assert.Equal(t, map[string]int64{"response": 1}, r.sums(t, "idemhttp.client.calls", idemotel.OutcomeAttr))
	assert.Equal(t, map[string]int64{"": 495}, r.sums(t, "idemhttp.client.budget.tokens", ""), "500, two retries of 5, the last refunded")
	assert.Equal(t, map[string]int64{"": 0}, r.sums(t, "idemhttp.client.in_flight", ""))
}

func TestKeyOnlyWhenAllowed(t *testing.T) {
	srv := statuses(t, 200)
	r := newRig(t, fast(), idemotel.Options{RecordKey: true, RecordOperation: true})
	ctx := idemhttp.WithOperation(context.Background(), "order-42")
	resp, err := r.post(t, ctx, srv.URL)
	require.NoError(t, err)
	info, ok := idemhttp.ResponseInfo(resp)
	require.True(t, ok)
	for _, s := range r.spans.Ended() {
		a := attrs(s)
		assert.Equal(t, info.Key, a[idemotel.KeyAttr].AsString(), s.Name())
		if s.SpanKind() == trace.SpanKindInternal {
			assert.Equal(t, "order-42", a[idemotel.OperationAttr].AsString())
		}
	}
	assert.Equal(t, map[string]int64{"begin": 1, "finish": 1}, r.sums(t, "idemhttp.client.journal.operations", idemotel.JournalOpAttr))
	assert.Equal(t, map[string]int64{"": 0}, r.sums(t, "idemhttp.client.journal.pending", ""))
}

func TestGiveUpsAndBudgetRefusals(t *testing.T) {
	srv := statuses(t, 503)
	pol := fast()
	pol.Budget = idemhttp.Budget{Capacity: 12, RetryCost: 5}
	r := newRig(t, pol, idemotel.Options{})
	_, err := r.post(t, context.Background(), srv.URL)
	require.ErrorIs(t, err, idemhttp.ErrBudgetExhausted)
	pol2 := fast()
	pol2.MaxAttempts = 2
	r2 := newRig(t, pol2, idemotel.Options{})
	_, err = r2.post(t, context.Background(), srv.URL)
	require.ErrorIs(t, err, idemhttp.ErrExhausted)

	assert.Equal(t, map[string]int64{"budget_exhausted": 1}, r.sums(t, "idemhttp.client.give_ups", idemotel.GiveUpReasonAttr))
	assert.Equal(t, map[string]int64{"": 1}, r.sums(t, "idemhttp.client.budget.refusals", ""))
	assert.Equal(t, map[string]int64{"": 2}, r.sums(t, "idemhttp.client.budget.tokens", ""))
	assert.Equal(t, map[string]int64{"exhausted": 1}, r2.sums(t, "idemhttp.client.give_ups", idemotel.GiveUpReasonAttr))
	for _, s := range r2.spans.Ended() {
		if s.SpanKind() == trace.SpanKindInternal {
			assert.Equal(t, codes.Error, s.Status().Code)
			assert.Equal(t, "exhausted", attrs(s)[idemotel.GiveUpReasonAttr].AsString())
		}
	}
}

func TestInProgressWaitsCounted(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) == 1 {
			// Lose the first response: the key may have been used.
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = c.Close()
			}
			return
		}
		if n.Load() == 2 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(409)
			return
		}
		w.WriteHeader(200)
	}))
	defer srv.Close()
	r := newRig(t, fast(), idemotel.Options{})
	_, err := r.post(t, context.Background(), srv.URL)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"": 1}, r.sums(t, "idemhttp.client.in_progress.waits", ""))
	assert.Equal(t, map[string]int64{"unknown_outcome": 1, "in_progress": 1}, r.sums(t, "idemhttp.client.retries", idemotel.RetryReasonAttr))
	assert.Equal(t, map[string]int64{"": 2, "unknown_outcome": 1}, r.sums(t, "idemhttp.client.attempts", idemotel.ErrorClassAttr))
}

func TestGiveUpReason(t *testing.T) {
	for err, want := range map[error]string{
		idemhttp.ErrExhausted: "exhausted", idemhttp.ErrInProgress: "in_progress", idemhttp.ErrBudgetExhausted: "budget_exhausted",
		idemhttp.ErrRetryAfterTooLong: "retry_after_too_long", idemhttp.ErrKeyRequired: "key_required",
		idemhttp.ErrBodyChanged: "body_changed", idemhttp.ErrNotReplayable: "not_replayable",
		context.DeadlineExceeded: "deadline", context.Canceled: "canceled", io.EOF: "other",
	} {
		assert.Equal(t, want, idemotel.GiveUpReason(err))
	}
}

// The server sees each attempt's own span as the parent in traceparent.
func TestTransportPropagatesTheAttemptSpan(t *testing.T) {
	var mu sync.Mutex
	var parents []string
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		parents = append(parents, r.Header.Get("Traceparent"))
		mu.Unlock()
		if n.Add(1) == 1 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(200)
	}))
	defer srv.Close()
	r := newRig(t, fast(), idemotel.Options{})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	r.client.HTTPClient = &http.Client{Transport: r.inst.Transport(tr, propagation.TraceContext{})}
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("X-Caller", "kept")
	resp, err := r.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Empty(t, req.Header.Get("Traceparent"), "the caller's request is not modified")

	var tries []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			tries = append(tries, s)
		}
	}
	require.Len(t, tries, 2)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, parents, 2)
	for i, s := range tries {
		assert.Contains(t, parents[i], s.SpanContext().SpanID().String(), "attempt %d", i+1)
		assert.Contains(t, parents[i], s.SpanContext().TraceID().String())
	}
}

// The journal's record writes and syncs are exported when the journal
// counts them (filejournal.Journal does): syncs per write is group commit's gain.
func TestJournalWritesAndSyncs(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	fj, err := filejournal.Open(filepath.Join(t.TempDir(), "journal"), nil)
	require.NoError(t, err)
	defer fj.Close()

	r := &rig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	r.client = &idemhttp.Client{Journal: fj, Policy: &idemhttp.Policy{AllowUnnamed: true}} // the calls are not what is measured
	inst, err := idemotel.New(r.client, &idemotel.Options{MeterProvider: mp})
	require.NoError(t, err)
	r.client.Hooks = inst.Hooks()
	for range 3 {
		_, err := r.post(t, context.Background(), srv.URL)
		require.NoError(t, err)
	}
	require.NoError(t, fj.Sync(context.Background()))
	writes := r.sums(t, "idemhttp.client.journal.writes", "")[""]
	syncs := r.sums(t, "idemhttp.client.journal.syncs", "")[""]
	assert.Equal(t, int64(fj.Stats().Writes), writes)
	assert.GreaterOrEqual(t, writes, int64(6), "a Begin and a Finish per call")
	assert.Positive(t, syncs)
	assert.LessOrEqual(t, syncs, writes)
	require.NoError(t, inst.Close())
}
