package idemhttp

//go:generate go run coldcode_gen.go

import (
	"net/http"
	"testing"
	"time"
)

// What BenchmarkDoInterleaved's ratios are made of, beyond instructions.
//
// A loopback round trip runs about 120 k instructions (client, server and
// runtime together), far more code than a core's 32 KiB instruction
// cache holds, so every call fetches the client's code afresh: what a
// client adds to a call costs its instructions plus one fetch of every
// cache line of code it runs, and the lines cost more than the
// instructions (bench/README.md, "Where the client's loopback gap
// goes"). BenchmarkDoStub's instruction counts, taken in a hot loop,
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
