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
)

// BenchmarkDo sends the same 1 KiB JSON POST to one loopback server through
// raw net/http, go-retryablehttp and idemhttp, each with its own transport
// of identical settings, so the sub-benchmarks differ only in the client.
func BenchmarkDo(b *testing.B) {
	payload := bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	defer srv.Close()
	newHTTP := func() *http.Client {
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	}
	send := func(b *testing.B, do func(*http.Request) (*http.Response, error)) {
		b.ReportAllocs()
		for b.Loop() {
			req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(payload))
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
	}

	b.Run("raw", func(b *testing.B) {
		hc := newHTTP()
		defer hc.CloseIdleConnections()
		send(b, hc.Do)
	})
	b.Run("retryablehttp", func(b *testing.B) {
		hc := newHTTP()
		defer hc.CloseIdleConnections()
		rc := retryablehttp.NewClient()
		rc.HTTPClient, rc.Logger = hc, nil
		send(b, func(r *http.Request) (*http.Response, error) {
			rr, err := retryablehttp.FromRequest(r)
			if err != nil {
				return nil, err
			}
			return rc.Do(rr)
		})
	})
	b.Run("idemhttp", func(b *testing.B) {
		hc := newHTTP()
		defer hc.CloseIdleConnections()
		c := &Client{HTTPClient: hc}
		send(b, c.Do)
	})
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
	payload := bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	defer srv.Close()
	newHTTP := func() *http.Client {
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	}
	raw, rhc, khc, ihc := newHTTP(), newHTTP(), newHTTP(), newHTTP()
	for _, hc := range []*http.Client{raw, rhc, khc, ihc} {
		defer hc.CloseIdleConnections()
	}
	retryable := func(hc *http.Client, keyed bool) func(*http.Request) (*http.Response, error) {
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
	idem := &Client{HTTPClient: ihc}
	clients := []func(*http.Request) (*http.Response, error){raw.Do, retryable(rhc, false), retryable(khc, true), idem.Do}
	var spent [4]time.Duration
	b.ReportAllocs()
	for b.Loop() {
		for i, do := range clients {
			start := time.Now()
			req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(payload))
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

// BenchmarkDoHooks is BenchmarkDo's idemhttp request with no hooks and
// with every hook set (each doing nothing), in one run: what a caller pays
// for observing every decision. "unset" must match BenchmarkDo/idemhttp's
// allocations.
func BenchmarkDoHooks(b *testing.B) {
	payload := bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	defer srv.Close()
	all := &Hooks{
		OnCallStart:     func(ctx context.Context, _ CallEvent) context.Context { return ctx },
		OnAttempt:       func(context.Context, AttemptEvent) {},
		OnAttemptDone:   func(context.Context, AttemptDoneEvent) {},
		OnRetry:         func(context.Context, RetryEvent) {},
		OnBudgetRefused: func(context.Context, BudgetEvent) {},
		OnGiveUp:        func(context.Context, GiveUpEvent) {},
		OnCallDone:      func(context.Context, CallDoneEvent) {},
		OnJournal:       func(context.Context, JournalEvent) {},
	}
	for _, bc := range []struct {
		name  string
		hooks *Hooks
	}{{"unset", nil}, {"set", all}} {
		b.Run(bc.name, func(b *testing.B) {
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
			defer hc.CloseIdleConnections()
			c := &Client{HTTPClient: hc, Hooks: bc.hooks}
			b.ReportAllocs()
			for b.Loop() {
				req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(payload))
				if err != nil {
					b.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
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
	payload := bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	defer srv.Close()
	all := &Hooks{
		OnCallStart:   func(ctx context.Context, _ CallEvent) context.Context { return ctx },
		OnAttempt:     func(context.Context, AttemptEvent) {},
		OnAttemptDone: func(context.Context, AttemptDoneEvent) {},
		OnRetry:       func(context.Context, RetryEvent) {},
		OnGiveUp:      func(context.Context, GiveUpEvent) {},
		OnCallDone:    func(context.Context, CallDoneEvent) {},
		OnJournal:     func(context.Context, JournalEvent) {},
	}
	uhc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	shc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer uhc.CloseIdleConnections()
	defer shc.CloseIdleConnections()
	clients := []*Client{{HTTPClient: uhc}, {HTTPClient: shc, Hooks: all}}
	var spent [2]time.Duration
	round := 0
	b.ReportAllocs()
	for b.Loop() {
		round++
		for k := range clients {
			i := (k + round) % 2 // alternate which goes first
			c := clients[i]
			start := time.Now()
			req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(payload))
			if err != nil {
				b.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			spent[i] += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "unset-ns/req")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "set-ns/req")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "set/unset")
}
