package suite

import (
	"context"
	"fmt"
	"math"
	"runtime/metrics"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/idemtest"
)

// Dialect is how the server words its errors.
type Dialect string

// The dialects of [idemtest.Options].
const (
	// DialectStripe renders errors as Stripe does: a JSON body
	// {"error":{"type":...}} and Stripe-Should-Retry (StripeErrors).
	DialectStripe Dialect = "stripe"
	// DialectIETF renders errors as application/problem+json, as the IETF
	// idempotency-key draft does (idemtest's default).
	DialectIETF Dialect = "ietf"
)

// options returns the server options of d with faults f.
func (d Dialect) options(f idemtest.Faults) (*idemtest.Options, error) {
	switch d {
	case DialectStripe, "":
		return &idemtest.Options{Faults: f, StripeErrors: true}, nil
	case DialectIETF:
		return &idemtest.Options{Faults: f}, nil
	}
	return nil, fmt.Errorf("unknown dialect %q (want %q or %q)", d, DialectStripe, DialectIETF)
}

// opName names the i-th operation of a run.
func opName(i int) string { return fmt.Sprintf("op-%05d", i) }

// opNames returns the names of n operations.
func opNames(n int) []string {
	ops := make([]string, n)
	for i := range ops {
		ops[i] = opName(i)
	}
	return ops
}

// opResult is what one operation's Send reported and cost.
type opResult struct {
	op       string
	status   int
	err      error
	attempts int           // the client's attempts
	resends  int           // net/http's silent resends within them
	start    time.Duration // since the run began
	latency  time.Duration // of the whole Send, retries and waits included
}

// ok reports whether the client reported success.
func (r opResult) ok() bool { return r.err == nil && r.status >= 200 && r.status < 300 }

// sendOne sends op through s with a probe and records the outcome.
func sendOne(ctx context.Context, s Sender, op string, begin time.Time) opResult {
	p := new(probe)
	start := time.Now()
	status, err := s.Send(withProbe(ctx, p), op, Body(op))
	return opResult{
		op:       op,
		status:   status,
		err:      err,
		attempts: int(p.attempts.Load()),
		resends:  int(p.resends.Load()),
		start:    start.Sub(begin),
		latency:  time.Since(start),
	}
}

// runClosed sends every op through s from concurrency workers, each taking
// the next op as soon as its previous one ends (a batch job's loop). done,
// when not nil, is called after each op, from the worker.
func runClosed(ctx context.Context, s Sender, ops []string, concurrency int, done func(opResult)) []opResult {
	results := make([]opResult, len(ops))
	next := make(chan int)
	var wg sync.WaitGroup
	begin := time.Now()
	for range max(concurrency, 1) {
		wg.Go(func() {
			for i := range next {
				results[i] = sendOne(ctx, s, ops[i], begin)
				if done != nil {
					done(results[i])
				}
			}
		})
	}
	for i := range ops {
		next <- i
	}
	close(next)
	wg.Wait()
	return results
}

// runOpen starts op i at i*interval after the run begins, whatever the
// earlier ones are doing (requests arriving from users, not a loop), and
// waits for all of them.
func runOpen(ctx context.Context, s Sender, ops []string, interval time.Duration) []opResult {
	results := make([]opResult, len(ops))
	var wg sync.WaitGroup
	begin := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for i := range ops {
		if d := time.Until(begin.Add(time.Duration(i) * interval)); d > 0 {
			t.Reset(d)
			<-t.C
		}
		wg.Go(func() { results[i] = sendOne(ctx, s, ops[i], begin) })
	}
	wg.Wait()
	return results
}

// effects sorts ops by how often the server ran them: never, once, more.
type effects struct {
	ran0, ran1, ranMore int
	duplicates          int // executions beyond the first
}

func countEffects(ops []string, executions map[string]int) effects {
	var e effects
	for _, op := range ops {
		switch n := executions[op]; {
		case n == 0:
			e.ran0++
		case n == 1:
			e.ran1++
		default:
			e.ranMore++
			e.duplicates += n - 1
		}
	}
	return e
}

// percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method, or 0 for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// goroutinesCreated returns how many goroutines this process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// quantile returns the q-th quantile (0 < q <= 1) of xs by the
// nearest-rank method, or 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
