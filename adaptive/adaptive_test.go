package adaptive

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a clock the test moves; sleeping moves it.
type fakeClock struct{ t time.Time }

func (f *fakeClock) now() time.Time { return f.t }
func (f *fakeClock) sleep(_ context.Context, d time.Duration) error {
	f.t = f.t.Add(d)
	return nil
}

func newRate() (*Rate, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	return &Rate{now: clk.now, sleep: clk.sleep}, clk
}

// send makes n attempts spread over d, observing each as throttled or
// not.
func send(r *Rate, clk *fakeClock, n int, d time.Duration, throttled bool) {
	for range n {
		clk.t = clk.t.Add(d / time.Duration(n))
		_ = r.Wait(context.Background())
		r.Observe(200, throttled)
	}
}

// Until the server throttles, nothing is paced; the first throttle sets
// the rate to 0.7 of the rate measured, and every throttle after cuts it
// again; successes raise it on a cubic curve, never above twice the
// measured rate. Checked to fail with beta 1 (no cut), and with the cap at
// twice the measured rate removed (the rate ran away past it).
func TestRateFollowsTheServer(t *testing.T) {
	r, clk := newRate()
	send(r, clk, 200, 2*time.Second, false) // 100 requests/s
	_, pacing := r.Limit()
	require.False(t, pacing, "no throttle yet: unpaced")

	r.Observe(429, true)
	first, pacing := r.Limit()
	require.True(t, pacing)
	assert.InDelta(t, 0.7*r.measured, first, 1, "cut to 0.7 of the measured rate (%.1f/s)", r.measured)

	r.Observe(429, true)
	second, _ := r.Limit()
	assert.Less(t, second, first, "cut again")

	send(r, clk, 400, 5*time.Second, false) // as fast as the pacing lets
	later, _ := r.Limit()
	assert.Greater(t, later, second, "successes raise it")

	// A client that sends little for long: the cubic curve alone would
	// reach thousands a second; the measured rate caps it.
	send(r, clk, 10, 20*time.Second, false)
	capped, _ := r.Limit()
	assert.LessOrEqual(t, capped, 2*r.measured+1e-9, "never above twice the measured rate (%.2f/s)", r.measured)
}

// Once pacing, Wait spaces the attempts at the rate: 50 attempts at a
// rate of about 10/s take about 5 s of (fake) time.
func TestWaitPaces(t *testing.T) {
	r, clk := newRate()
	send(r, clk, 100, time.Second, false)
	r.Observe(429, true)
	rate, _ := r.Limit()
	start := clk.t
	for range 50 {
		require.NoError(t, r.Wait(context.Background()))
	}
	took := clk.t.Sub(start).Seconds()
	assert.InDelta(t, 50/rate, took, 50/rate*0.3+1, "50 tokens at %.1f/s", rate)
}

// Wait ends with the context.
func TestWaitEndsWithTheContext(t *testing.T) {
	var r Rate
	r.Observe(429, true) // enabled, with the least rate
	r.mu.Lock()
	r.tokens = 0
	r.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, r.Wait(ctx), context.Canceled)
}
