package otel_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	idemotel "github.com/idemkit/idemhttp/contrib/otel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// The metrics through the OpenTelemetry Prometheus exporter, as a
// Prometheus server scrapes them from /metrics.
func ExampleNew_prometheus() {
	var n atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()

	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		fmt.Println(err)
		return
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()

	c := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: 10 * time.Millisecond}}
	inst, err := idemotel.New(c, &idemotel.Options{MeterProvider: mp})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer inst.Close()
	c.Hooks = inst.Hooks()
	req, _ := http.NewRequest("POST", api.URL+"/v1/charges", strings.NewReader(`{"amount":1000}`))
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()

	scraper := metrics.Client() // a Prometheus server, here
	defer scraper.CloseIdleConnections()
	scrape, err := scraper.Get(metrics.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer scrape.Body.Close()
	sc := bufio.NewScanner(scrape.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "idemhttp_client_retries") || strings.HasPrefix(line, "idemhttp_client_budget_tokens") ||
			strings.HasPrefix(line, "idemhttp_client_calls") {
			fmt.Println(line)
		}
	}
	// Output:
	// idemhttp_client_budget_tokens 495
	// idemhttp_client_calls_total{http_request_method="POST",idemhttp_outcome="response",idemhttp_replayed="false"} 1
	// idemhttp_client_retries_total{idemhttp_retry_reason="unavailable"} 2
}
