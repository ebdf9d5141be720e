package adaptive_test

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/adaptive"
)

var (
	batchOps  = flag.Int("adaptive.ops", 10000, "operations in BenchmarkThrottledBatch")
	batchRate = flag.Float64("adaptive.rate", 500, "requests a second the server of BenchmarkThrottledBatch accepts")
)

// throttled is a server that accepts perSecond requests a second (a token
// bucket with a burst of a tenth of a second) and answers the others 429
// with Retry-After: 1.
type throttled struct {
	mu        sync.Mutex
	perSecond float64
	tokens    float64
	last      time.Time
	ok, no    atomic.Int64
}

func (s *throttled) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	now := time.Now()
	if s.last.IsZero() {
		s.last = now
	}
	burst := s.perSecond / 10
	s.tokens = min(burst, s.tokens+now.Sub(s.last).Seconds()*s.perSecond)
	s.last = now
	take := s.tokens >= 1
	if take {
		s.tokens--
	}
	s.mu.Unlock()
	if !take {
		s.no.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	s.ok.Add(1)
	w.WriteHeader(http.StatusCreated)
}

// BenchmarkThrottledBatch runs a batch of operations (10,000; -adaptive.ops)
// through 32 workers against a server that accepts 500 requests a second
// (-adaptive.rate) and answers the rest 429 with Retry-After: 1, with the policy's
// retries alone and with an adaptive Rate, and reports the throttled
// responses, the attempts and the batch's time. Issue 26 §7; the numbers
// are in bench/README.md.
//
//	go test -run '^$' -bench ThrottledBatch -benchtime=1x -count=3 ./adaptive/
func BenchmarkThrottledBatch(b *testing.B) {
	for _, mode := range []string{"fixed", "adaptive"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				srv := &throttled{perSecond: *batchRate}
				ts := httptest.NewServer(srv)
				pol := &idemhttp.Policy{MaxAttempts: 20, BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second, MaxRetryAfter: 2 * time.Second,
					Budget: idemhttp.Budget{Disabled: true}}
				if mode == "adaptive" {
					pol.Pacer = &adaptive.Rate{}
				}
				c := &idemhttp.Client{Policy: pol, HTTPClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
				ops := make(chan int)
				var failed atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for range 32 {
					wg.Go(func() {
						for i := range ops {
							ctx := idemhttp.WithOperation(context.Background(), fmt.Sprint("op-", i))
							req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL, strings.NewReader(`{"amount":1}`))
							resp, err := c.Do(req)
							if err != nil {
								failed.Add(1)
								continue
							}
							resp.Body.Close()
						}
					})
				}
				for i := range *batchOps {
					ops <- i
				}
				close(ops)
				wg.Wait()
				took := time.Since(start)
				ts.Close()
				b.ReportMetric(took.Seconds(), "batch-s")
				b.ReportMetric(float64(srv.no.Load()), "throttled")
				b.ReportMetric(float64(srv.ok.Load()+srv.no.Load())/float64(*batchOps), "attempts/op")
				b.ReportMetric(float64(failed.Load()), "failed")
			}
		})
	}
}
