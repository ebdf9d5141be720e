package otel_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	idemotel "github.com/idemkit/idemhttp/contrib/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// BenchmarkInstrumented sends a 1 KiB JSON POST through a bare client and
// through one instrumented with the SDK (every span sampled and recorded
// in memory, metrics to a ManualReader), in turn, alternating which goes
// first, and reports each one's mean time per request and the ratio.
func BenchmarkInstrumented(b *testing.B) {
	payload := bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"id":"ch_1"}`))
	}))
	defer srv.Close()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())

	bt, it := &http.Transport{MaxIdleConnsPerHost: 16}, &http.Transport{MaxIdleConnsPerHost: 16}
	defer bt.CloseIdleConnections()
	defer it.CloseIdleConnections()
	bare := &idemhttp.Client{HTTPClient: &http.Client{Transport: bt}}
	inst := &idemhttp.Client{HTTPClient: &http.Client{Transport: it}}
	in, err := idemotel.New(inst, &idemotel.Options{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	inst.Hooks = in.Hooks()
	clients := []*idemhttp.Client{bare, inst}
	var spent [2]time.Duration
	round := 0
	b.ReportAllocs()
	for b.Loop() {
		round++
		for k := range clients {
			i := (k + round) % 2
			start := time.Now()
			req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(payload))
			if err != nil {
				b.Fatal(err)
			}
			resp, err := clients[i].Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			spent[i] += time.Since(start)
		}
		if round%1000 == 0 {
			spans.Reset() // keep the recorder's memory bounded
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "bare-ns/req")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "otel-ns/req")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "otel/bare")
}
