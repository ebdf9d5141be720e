package idemserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
)

const benchBody = `{"amount":2000,"currency":"usd","operation":"order-1234"}`

// benchHandler is a small JSON API endpoint: it reads the body and answers
// 201 with a charge object.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"id":"ch_1","object":"charge","amount":2000,"currency":"usd","status":"succeeded"}`)
})

// benchTargets are the handlers compared in one run: the bare handler is
// the baseline for the middleware's overhead.
var benchTargets = []struct {
	name string
	wrap func(http.Handler) http.Handler
}{
	{"bare", func(h http.Handler) http.Handler { return h }},
	{"idemserver", (&idemserver.Middleware{SingleTenant: true}).Wrap},
}

// benchServer starts a loopback server and a client that keeps enough idle
// connections for 64 concurrent requests.
func benchServer(b *testing.B, h http.Handler) (*httptest.Server, *http.Client) {
	b.Helper()
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 128
	b.Cleanup(tr.CloseIdleConnections)
	return srv, &http.Client{Transport: tr}
}

// benchPost sends one keyed POST (every key distinct: each request is a
// new claim, run and stored, the middleware's full path) and drains the
// response.
func benchPost(b *testing.B, c *http.Client, url, key string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(benchBody))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b.Fatalf("status %d", resp.StatusCode)
	}
}

// BenchmarkRoundTrip measures one request at a time over loopback, client
// included, so the middleware's cost shows against a real round trip.
func BenchmarkRoundTrip(b *testing.B) {
	for _, bt := range benchTargets {
		b.Run(bt.name, func(b *testing.B) {
			srv, c := benchServer(b, bt.wrap(benchHandler))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				benchPost(b, c, srv.URL+"/v1/charges", "k-"+strconv.Itoa(i))
			}
		})
	}
}

// BenchmarkRoundTripParallel64 measures throughput with 64 concurrent
// clients, each sending distinct keys.
func BenchmarkRoundTripParallel64(b *testing.B) {
	for _, bt := range benchTargets {
		b.Run(bt.name, func(b *testing.B) {
			srv, c := benchServer(b, bt.wrap(benchHandler))
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism((64 + testingProcs() - 1) / testingProcs())
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					benchPost(b, c, srv.URL+"/v1/charges", "k-"+strconv.FormatInt(n.Add(1), 10))
				}
			})
		})
	}
}

// BenchmarkRoundTripInterleaved sends one request to the bare handler and
// one to the middleware per iteration, alternating which goes first, and
// reports each one's mean time and their ratio: on a shared machine whose
// load drifts between sub-benchmarks, interleaving puts both under the same
// conditions. ns/op counts the pair.
func BenchmarkRoundTripInterleaved(b *testing.B) {
	bareSrv, bareClient := benchServer(b, benchTargets[0].wrap(benchHandler))
	idemSrv, idemClient := benchServer(b, benchTargets[1].wrap(benchHandler))
	var bare, idem time.Duration
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		key := "k-" + strconv.Itoa(i)
		for j := range 2 {
			start := time.Now()
			if (i+j)%2 == 0 {
				benchPost(b, bareClient, bareSrv.URL+"/v1/charges", key)
				bare += time.Since(start)
			} else {
				benchPost(b, idemClient, idemSrv.URL+"/v1/charges", key)
				idem += time.Since(start)
			}
		}
	}
	b.ReportMetric(float64(bare.Nanoseconds())/float64(i), "bare-ns/req")
	b.ReportMetric(float64(idem.Nanoseconds())/float64(i), "idemserver-ns/req")
	b.ReportMetric(float64(idem)/float64(bare), "ratio")
}

// BenchmarkServeHTTP measures the middleware alone, without the network:
// a new key per request (without and with hooks), and a replay of one
// stored key.
func BenchmarkServeHTTP(b *testing.B) {
	newReq := func(key string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(benchBody))
		r.Header.Set("Content-Type", "application/json") // as benchPost: the fingerprint canonicalises it
		r.Header.Set("Idempotency-Key", key)
		return r
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			benchHandler.ServeHTTP(httptest.NewRecorder(), newReq("k-"+strconv.Itoa(i)))
		}
	})
	b.Run("new-key", func(b *testing.B) {
		h := (&idemserver.Middleware{SingleTenant: true}).Wrap(benchHandler)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			h.ServeHTTP(httptest.NewRecorder(), newReq("k-"+strconv.Itoa(i)))
		}
	})
	b.Run("new-key-hooks", func(b *testing.B) {
		// Every hook set, doing nothing: the cost of building the events.
		hooks := &idemserver.Hooks{
			OnClaim:       func(context.Context, idemserver.ClaimEvent) {},
			OnStored:      func(context.Context, idemserver.StoredEvent) {},
			OnReleased:    func(context.Context, idemserver.ReleasedEvent) {},
			OnRenewFailed: func(context.Context, idemserver.RenewFailedEvent) {},
			OnStoreError:  func(context.Context, idemserver.StoreErrorEvent) {},
			OnRefused:     func(context.Context, idemserver.RefusedEvent) {},
		}
		h := (&idemserver.Middleware{SingleTenant: true, Hooks: hooks}).Wrap(benchHandler)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			h.ServeHTTP(httptest.NewRecorder(), newReq("k-"+strconv.Itoa(i)))
		}
	})
	b.Run("replay", func(b *testing.B) {
		h := (&idemserver.Middleware{SingleTenant: true}).Wrap(benchHandler)
		h.ServeHTTP(httptest.NewRecorder(), newReq("k"))
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(httptest.NewRecorder(), newReq("k"))
		}
	})
}

// testingProcs is GOMAXPROCS, the goroutines per unit of b.SetParallelism.
func testingProcs() int { return runtime.GOMAXPROCS(0) }
