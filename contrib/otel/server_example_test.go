package otel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"

	idemotel "github.com/idemkit/idemhttp/contrib/otel"
	"github.com/idemkit/idemhttp/idemserver"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The server half: a charge, its replay and a reuse of its key with
// another amount, as events on the server spans and as metrics. The
// server span here stands in for otelhttp.NewHandler's, wrapped around
// the middleware; the hooks never start spans of their own.
func ExampleNewServer() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	inst, err := idemotel.NewServer(&idemotel.Options{MeterProvider: mp})
	if err != nil {
		fmt.Println(err)
		return
	}
	mw := &idemserver.Middleware{SingleTenant: true, Hooks: inst.Hooks()}
	charge := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	tracer := tp.Tracer("otelhttp stand-in")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), r.Method+" /v1/charges", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		charge.ServeHTTP(w, r.WithContext(ctx))
	})

	for _, body := range []string{`{"amount":100}`, `{"amount":100}`, `{"amount":999}`} {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code)
	}
	for _, s := range spans.Ended() {
		var events []string
		for _, ev := range s.Events() {
			events = append(events, ev.Name)
		}
		fmt.Printf("%s %s outcome=%v events=%v\n", s.SpanKind(), s.Name(), attr(s, "idemhttp.claim.outcome"), events)
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s = %d", m.Name, labels(p.Attributes.ToSlice()), p.Value))
				}
			}
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// 201
	// 201
	// 422
	// server POST /v1/charges outcome=new events=[idemhttp.claim idemhttp.stored]
	// server POST /v1/charges outcome=replay events=[idemhttp.claim]
	// server POST /v1/charges outcome=mismatch events=[idemhttp.claim]
	// idemhttp.server.claims{http.request.method=POST,idemhttp.claim.outcome=mismatch} = 1
	// idemhttp.server.claims{http.request.method=POST,idemhttp.claim.outcome=new} = 1
	// idemhttp.server.claims{http.request.method=POST,idemhttp.claim.outcome=replay} = 1
	// idemhttp.server.stored{http.request.method=POST,idemhttp.replayable=true} = 1
}
