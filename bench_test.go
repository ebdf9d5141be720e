package idemhttp

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/idemkit/idemhttp/idemtrace"
)

// The request every BenchmarkDo* sends: a 1 KiB JSON POST to a loopback
// server that reads it and answers a small charge object.

var benchPayload = bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]

type doFunc func(*http.Request) (*http.Response, error)

func newChargeServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	b.Cleanup(srv.Close)
	return srv
}

// newBenchHTTP returns an http.Client with a transport of its own, the
// same settings for every client compared.
func newBenchHTTP(b *testing.B) *http.Client {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	b.Cleanup(hc.CloseIdleConnections)
	return hc
}

// retryableDo sends through go-retryablehttp over hc; with keyed, the
// caller sets a fresh Idempotency-Key on each request.
func retryableDo(hc *http.Client, keyed bool) doFunc {
	rc := retryablehttp.NewClient()
	rc.HTTPClient, rc.Logger = hc, nil
	return func(r *http.Request) (*http.Response, error) {
		if keyed {
			r.Header.Set("Idempotency-Key", NewKey())
		}
		rr, err := retryablehttp.FromRequest(r)
		if err != nil {
			return nil, err
		}
		return rc.Do(rr)
	}
}

// sendCharge sends the benchmark's request to url through do and reads
// the answer to the end, as every caller that reuses connections must.
func sendCharge(b *testing.B, url string, do doFunc) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(benchPayload))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// BenchmarkDo sends the same 1 KiB JSON POST to one loopback server through
// raw net/http, go-retryablehttp and idemhttp, each with its own transport
// of identical settings, so the sub-benchmarks differ only in the client.
func BenchmarkDo(b *testing.B) {
	srv := newChargeServer(b)
	for _, bc := range []struct {
		name string
		do   func(*http.Client) doFunc
	}{
		{"raw", func(hc *http.Client) doFunc { return hc.Do }},
		{"retryablehttp", func(hc *http.Client) doFunc { return retryableDo(hc, false) }},
		{"idemhttp", func(hc *http.Client) doFunc { return (&Client{HTTPClient: hc}).Do }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			do := bc.do(newBenchHTTP(b))
			b.ReportAllocs()
			for b.Loop() {
				sendCharge(b, srv.URL, do)
			}
		})
	}
}

// BenchmarkDoInterleaved sends the same request as BenchmarkDo through
// the clients in turn, one request each per iteration, and reports each
// client's mean time per request: on a shared, noisy machine they then see
// the same noise, which sequential sub-benchmarks do not. The ratios are
// what to quote. "retryablehttp+key" is go-retryablehttp with a fresh
// Idempotency-Key set by the caller on each request: the in-process server
// parses one more header for every keyed client, a cost of idempotency
// itself that go-retryablehttp alone does not pay.
func BenchmarkDoInterleaved(b *testing.B) {
	srv := newChargeServer(b)
	clients := []doFunc{
		newBenchHTTP(b).Do,
		retryableDo(newBenchHTTP(b), false),
		retryableDo(newBenchHTTP(b), true),
		(&Client{HTTPClient: newBenchHTTP(b)}).Do,
	}
	var spent [4]time.Duration
	b.ReportAllocs()
	for b.Loop() {
		for i, do := range clients {
			start := time.Now()
			sendCharge(b, srv.URL, do)
			spent[i] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "raw-ns/req")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "retryablehttp-ns/req")
	b.ReportMetric(float64(spent[2].Nanoseconds())/n, "retryablehttp+key-ns/req")
	b.ReportMetric(float64(spent[3].Nanoseconds())/n, "idemhttp-ns/req")
	b.ReportMetric(float64(spent[3])/float64(spent[1]), "idem/retryablehttp")
	b.ReportMetric(float64(spent[3])/float64(spent[2]), "idem/retryablehttp+key")
	b.ReportMetric(float64(spent[3])/float64(spent[0]), "idem/raw")
}

// noopHooks sets every hook, each doing nothing: what observing every
// decision costs before the observer does any work.
func noopHooks() *idemtrace.Hooks {
	return &idemtrace.Hooks{
		OnCallStart:     func(ctx context.Context, _ idemtrace.CallEvent) context.Context { return ctx },
		OnAttempt:       func(context.Context, idemtrace.AttemptEvent) {},
		OnAttemptDone:   func(context.Context, idemtrace.AttemptDoneEvent) {},
		OnRetry:         func(context.Context, idemtrace.RetryEvent) {},
		OnBudgetRefused: func(context.Context, idemtrace.BudgetEvent) {},
		OnGiveUp:        func(context.Context, idemtrace.GiveUpEvent) {},
		OnCallDone:      func(context.Context, idemtrace.CallDoneEvent) {},
		OnJournal:       func(context.Context, idemtrace.JournalEvent) {},
	}
}

// BenchmarkDoHooks is BenchmarkDo's idemhttp request with no hooks and
// with every hook set (each doing nothing), in one run: what a caller pays
// for observing every decision. "unset" must match BenchmarkDo/idemhttp's
// allocations.
func BenchmarkDoHooks(b *testing.B) {
	srv := newChargeServer(b)
	for _, bc := range []struct {
		name  string
		hooks *idemtrace.Hooks
	}{{"unset", nil}, {"set", noopHooks()}} {
		b.Run(bc.name, func(b *testing.B) {
			c := &Client{HTTPClient: newBenchHTTP(b), Hooks: bc.hooks}
			b.ReportAllocs()
			for b.Loop() {
				sendCharge(b, srv.URL, c.Do)
			}
		})
	}
}

// BenchmarkDoHooksInterleaved sends BenchmarkDoHooks's request through a
// client without hooks and one with every hook set, in turn, and reports
// each one's mean time per request and their ratio (set ÷ unset): on a
// shared machine the two then see the same noise. Which goes first
// alternates, so neither gets the warmer connection or scheduler slot.
func BenchmarkDoHooksInterleaved(b *testing.B) {
	srv := newChargeServer(b)
	clients := []*Client{{HTTPClient: newBenchHTTP(b)}, {HTTPClient: newBenchHTTP(b), Hooks: noopHooks()}}
	var spent [2]time.Duration
	round := 0
	b.ReportAllocs()
	for b.Loop() {
		round++
		for k := range clients {
			i := (k + round) % 2 // alternate which goes first
			start := time.Now()
			sendCharge(b, srv.URL, clients[i].Do)
			spent[i] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "unset-ns/req")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "set-ns/req")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "set/unset")
}
