// Package adaptive paces an idemhttp Client to the rate a throttling
// server allows, as the AWS SDKs' adaptive retry mode does: a client-side
// token bucket, off until the server first throttles (a 429, or a 503
// with Retry-After), whose rate then falls by a factor on every throttle
// and climbs back on a cubic curve (the CUBIC congestion control of TCP)
// as requests succeed, never above twice the rate the client was measured
// sending. A batch job that would otherwise spend its retries, and the
// server's patience, on 429s sends at about the rate the server accepts.
//
//	c := &idemhttp.Client{Policy: &idemhttp.Policy{Pacer: &adaptive.Rate{}}}
//
// It builds on nothing but the standard library; idemhttp calls Wait
// before every attempt and Observe after it.
package adaptive

import (
	"context"
	"math"
	"sync"
	"time"
)

// The constants of the AWS SDKs' adaptive mode (botocore's
// retries/adaptive.py and its equivalents in the other SDKs).
const (
	beta           = 0.7 // the rate kept on a throttle
	scaleConstant  = 0.4 // the cubic curve's steepness
	smoothing      = 0.8 // of the measured send rate
	bucketInterval = 0.5 // seconds over which the send rate is measured
	minRate        = 0.5 // requests per second, at the least
	maxRateAdjust  = 2.0 // the rate never exceeds this times the measured one
)

// Rate is an adaptive client-side rate: an idemhttp Policy's Pacer. The
// zero value is ready to use and sends unpaced until the first throttle.
// A Rate is safe for concurrent use; share one among the clients that
// call the same server, so that they slow down together.
type Rate struct {
	// now, for tests, replaces time.Now; sleep, time.Sleep's
	// context-aware equivalent.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error

	mu      sync.Mutex
	start   time.Time // the origin of the clock below, in seconds
	enabled bool      // the server has throttled: the bucket paces

	// The token bucket.
	fillRate  float64 // tokens per second
	capacity  float64
	tokens    float64
	lastFill  float64
	bucketSet bool

	// The measured send rate.
	measured   float64
	count      float64
	lastBucket float64

	// The cubic curve.
	wMax     float64 // the rate at the last throttle
	k        float64 // the curve's zero point
	lastFail float64
}

// clock returns the time, in seconds since the Rate's first use.
func (r *Rate) clock() float64 {
	now := time.Now
	if r.now != nil {
		now = r.now
	}
	t := now()
	if r.start.IsZero() {
		r.start = t
	}
	return t.Sub(r.start).Seconds()
}

// Wait waits for the bucket's next token when the server has throttled,
// or returns at once; it returns ctx's error if ctx ends first.
func (r *Rate) Wait(ctx context.Context) error {
	for {
		r.mu.Lock()
		if !r.enabled {
			r.mu.Unlock()
			return nil
		}
		now := r.clock()
		r.refill(now)
		if r.tokens >= 1-1e-9 { // a token, but for the float's rounding
			r.tokens = math.Max(r.tokens-1, 0)
			r.mu.Unlock()
			return nil
		}
		// Rounded up, and at least a nanosecond: a wait rounded down to
		// nothing would spin.
		wait := time.Duration(math.Ceil((1 - r.tokens) / r.fillRate * float64(time.Second)))
		r.mu.Unlock()
		if err := r.pause(ctx, wait); err != nil {
			return err
		}
	}
}

func (r *Rate) pause(ctx context.Context, d time.Duration) error {
	if r.sleep != nil {
		return r.sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Observe takes an attempt's outcome: its status (0 for a transport
// error) and whether the server throttled it. A throttle lowers the rate;
// anything else lets it climb.
func (r *Rate) Observe(status int, throttled bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock()
	measured := r.record(now)
	var rate float64
	if throttled {
		use := measured
		if r.enabled {
			use = math.Min(measured, r.fillRate)
		}
		r.wMax, r.lastFail = use, now
		r.k = math.Cbrt(r.wMax * (1 - beta) / scaleConstant)
		rate = use * beta
		r.enabled = true
	} else {
		if !r.enabled {
			return
		}
		dt := now - r.lastFail
		rate = scaleConstant*math.Pow(dt-r.k, 3) + r.wMax
	}
	r.setRate(now, math.Min(rate, maxRateAdjust*measured))
}

// record counts a response and returns the smoothed send rate.
func (r *Rate) record(now float64) float64 {
	bucket := math.Floor(now/bucketInterval) * bucketInterval
	r.count++
	if bucket > r.lastBucket {
		current := r.count / (bucket - r.lastBucket)
		r.measured = current*smoothing + r.measured*(1-smoothing)
		r.count, r.lastBucket = 0, bucket
	}
	return r.measured
}

func (r *Rate) refill(now float64) {
	if !r.bucketSet {
		r.lastFill, r.bucketSet = now, true
		return
	}
	r.tokens = math.Min(r.capacity, r.tokens+(now-r.lastFill)*r.fillRate)
	r.lastFill = now
}

func (r *Rate) setRate(now, rate float64) {
	r.refill(now)
	r.fillRate = math.Max(rate, minRate)
	r.capacity = math.Max(rate, 1)
	r.tokens = math.Min(r.tokens, r.capacity)
}

// Limit returns the current rate, in requests per second, and whether
// the bucket paces at all (the server has throttled).
func (r *Rate) Limit() (perSecond float64, pacing bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fillRate, r.enabled
}
