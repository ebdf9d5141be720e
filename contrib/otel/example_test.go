package otel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	idemotel "github.com/idemkit/idemhttp/contrib/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A call that retried twice (503, then 500, then 201), as a trace and as
// the metrics a dashboard charts. The in-memory exporters stand in for an
// OTLP or Prometheus exporter.
func Example() {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader([]int{503, 500, 201}[min(int(n.Add(1))-1, 2)])
	}))
	defer srv.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	c := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: 10 * time.Millisecond}}
	inst, err := idemotel.New(c, &idemotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer inst.Close()
	c.Hooks = inst.Hooks()

	req, _ := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(`{"amount":1000}`))
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()

	// The trace: the call's span, then its attempts (they end first).
	ended := spans.Ended()
	call := ended[len(ended)-1]
	fmt.Printf("%s attempts=%v status=%v\n", call.Name(), attr(call, "idemhttp.attempts"), attr(call, "http.response.status_code"))
	for _, s := range ended[:len(ended)-1] {
		fmt.Printf("  %s %s resend_count=%v status=%v retry.reason=%v\n", s.SpanKind(), s.Name(),
			attr(s, "http.request.resend_count"), attr(s, "http.response.status_code"), attr(s, "idemhttp.retry.reason"))
	}

	// The metrics.
	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s = %d", m.Name, labels(p.Attributes.ToSlice()), p.Value))
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s = %d", m.Name, p.Value))
				}
			}
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// idemhttp POST attempts=3 status=201
	//   client POST resend_count=- status=503 retry.reason=unavailable
	//   client POST resend_count=1 status=500 retry.reason=server_error
	//   client POST resend_count=2 status=201 retry.reason=-
	// idemhttp.client.attempts{error.type=500,http.request.method=POST,http.response.status_code=500} = 1
	// idemhttp.client.attempts{error.type=503,http.request.method=POST,http.response.status_code=503} = 1
	// idemhttp.client.attempts{http.request.method=POST,http.response.status_code=201} = 1
	// idemhttp.client.budget.capacity = 500
	// idemhttp.client.budget.tokens = 495
	// idemhttp.client.calls{http.request.method=POST,idemhttp.outcome=response,idemhttp.replayed=false} = 1
	// idemhttp.client.in_flight = 0
	// idemhttp.client.journal.pending = 0
	// idemhttp.client.retries{idemhttp.retry.reason=server_error} = 1
	// idemhttp.client.retries{idemhttp.retry.reason=unavailable} = 1
}

// attr returns a span attribute's value, or "-".
func attr(s sdktrace.ReadOnlySpan, key string) any {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.AsInterface()
		}
	}
	return "-"
}

func labels(kvs []attribute.KeyValue) string {
	if len(kvs) == 0 {
		return ""
	}
	parts := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		parts = append(parts, string(kv.Key)+"="+kv.Value.String())
	}
	return "{" + strings.Join(parts, ",") + "}"
}
