package storeharness

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
)

// benchRecord is a typical stored response: a 201 with a JSON body.
var benchRecord = func() []byte {
	r := &idemserver.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Request-Id": {"req_0123456789abcdef"}},
		Body:   []byte(`{"id":"ch_3MmlLrLkdIwHu7ix0snN0B15","object":"charge","amount":1099,"currency":"usd","status":"succeeded","paid":true,"captured":true}`),
	}
	b, _ := r.MarshalBinary()
	return b
}()

// BenchClaimComplete measures s's round trips for one request (Claim of a
// new key, then Complete with a small response) at concurrency conc, and
// reports ops/s.
func BenchClaimComplete(b *testing.B, s idemserver.Store, conc int) {
	ctx := context.Background()
	var n atomic.Int64
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36) + ":" // fresh keys in a shared store
	op := func() {
		key := prefix + strconv.FormatInt(n.Add(1), 36)
		res, err := s.Claim(ctx, key, idemserver.Claim{Token: key, Fingerprint: "fp", LockTimeout: time.Minute})
		if err != nil || res.State != idemserver.Claimed {
			b.Fatalf("claim: %v, %v", res.State, err)
		}
		if err := s.Complete(ctx, key, key, benchRecord, time.Hour); err != nil {
			b.Fatalf("complete: %v", err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	if conc == 1 {
		for b.Loop() {
			op()
		}
	} else {
		b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				op()
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
