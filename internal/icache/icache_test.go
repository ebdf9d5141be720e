package icache

//go:generate go run coldcode_gen.go

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
)

// What the root package's BenchmarkDoInterleaved's ratios are made of, beyond instructions.
//
// A loopback round trip runs about 120 k instructions (client, server and
// runtime together), far more code than a core's 32 KiB instruction
// cache holds, so every call fetches the client's code afresh: what a
// client adds to a call costs its instructions plus one fetch of every
// cache line of code it runs, and the lines cost more than the
// instructions (bench/README.md, "Where the client's loopback gap
// goes"). The root package's BenchmarkDoStub's instruction counts, taken in a hot loop,
// see only the first. BenchmarkICache measures both on the machine it
// runs on: raw+key after running coldFuncs small functions once each
// ("cold": their ~24 KiB of code is fetched on every call) and after
// running one of them as many times ("hot": the same instructions, one
// function's code). bench/icache.sh counts the cache misses of each arm
// and each client (valgrind's cachegrind), which turns them into time.

// icacheSink keeps coldRun and hotRun from being optimised away.
var icacheSink uint64

// withCode is raw+key after run(coldFuncs) on every call.
func withCode(run func(int, uint64) uint64) func(*http.Client) doFunc {
	return func(hc *http.Client) doFunc {
		do := rawKeyDo(hc)
		return func(r *http.Request) (*http.Response, error) {
			icacheSink = run(coldFuncs, icacheSink)
			return do(r)
		}
	}
}

// icacheArms are BenchmarkICache's clients: raw+key, and raw+key with
// the same extra instructions run from one function's code (hot) or from
// coldFuncs functions' code (cold).
var icacheArms = []struct {
	name string
	do   func(*http.Client) doFunc
}{
	{"raw+key", rawKeyDo},
	{"raw+key+hot", withCode(hotRun)},
	{"raw+key+cold", withCode(coldRun)},
}

// BenchmarkICache sends BenchmarkDo's request through raw+key,
// raw+key+hot and raw+key+cold (icacheArms). "interleaved" sends one
// request through each per iteration, the order rotated as in
// BenchmarkDoInterleaved, and reports the per-iteration ratio medians
// against raw+key and cold's median extra time over hot per request
// (cold-hot-ns): what fetching coldRun's code costs per call, the
// instructions being the same. The other sub-benchmarks send through one
// arm each, for bench/icache.sh to count its cache misses.
func BenchmarkICache(b *testing.B) {
	srv := newChargeServer(b)
	b.Run("interleaved", func(b *testing.B) {
		n := len(icacheArms)
		clients := make([]doFunc, n)
		for i, arm := range icacheArms {
			clients[i] = arm.do(newBenchHTTP(b))
		}
		ratios := make([][]float64, n)
		var extra []float64 // cold - hot, per iteration
		took := make([]time.Duration, n)
		round := 0
		for b.Loop() {
			for k := range n {
				i := (k + round) % n
				start := time.Now()
				sendCharge(b, srv.URL, clients[i])
				took[i] = time.Since(start)
			}
			round++
			for i := 1; i < n; i++ {
				ratios[i] = append(ratios[i], float64(took[i])/float64(took[0]))
			}
			extra = append(extra, float64(took[2]-took[1]))
		}
		for i := 1; i < n; i++ {
			b.ReportMetric(median(ratios[i]), icacheArms[i].name+"/raw+key")
		}
		b.ReportMetric(median(extra), "cold-hot-ns")
	})
	for _, arm := range icacheArms {
		b.Run(arm.name, func(b *testing.B) {
			do := arm.do(newBenchHTTP(b))
			b.ReportAllocs()
			for b.Loop() {
				sendCharge(b, srv.URL, do)
			}
		})
	}
}

// The helpers below are the root package's (bench_test.go), copied so
// that raw+key here sends the same request as BenchmarkDo's raw+key.

// benchPayload is BenchmarkDo's request body: 1 KiB of JSON.
var benchPayload = bytes.Repeat([]byte(`{"k":"v"},`), 103)[:1024]

type doFunc func(*http.Request) (*http.Response, error)

// newChargeServer is BenchmarkDo's loopback server: it reads the request
// and answers a small charge object.
func newChargeServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"ch_1","status":"succeeded"}`))
	}))
	b.Cleanup(srv.Close)
	return srv
}

// newBenchHTTP returns an http.Client with a transport of its own.
func newBenchHTTP(b *testing.B) *http.Client {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	b.Cleanup(hc.CloseIdleConnections)
	return hc
}

// sendCharge sends the benchmark's request to url through do and reads
// the answer to the end.
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

// rawKeyDo sends through hc with a fresh Idempotency-Key set on each
// request: net/http plus one header.
func rawKeyDo(hc *http.Client) doFunc {
	return func(r *http.Request) (*http.Response, error) {
		r.Header.Set("Idempotency-Key", idemhttp.NewKey())
		return hc.Do(r)
	}
}

// median returns the median of xs (which it sorts).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
