package idemtest

import (
	"encoding/binary"
	"hash/fnv"
	"time"
)

// FaultKind names a fault the server can inject.
type FaultKind string

// The fault kinds, in the order a request's decision tries them.
const (
	// FaultDropRequest: the connection is closed before the request is
	// processed; nothing ran, and the client sees a reset or EOF.
	FaultDropRequest FaultKind = "drop-request"
	// FaultDropResponse: the request is processed (the side effect happens
	// and the response is stored), then the connection is closed without a
	// reply: the client cannot tell this from a dropped request.
	FaultDropResponse FaultKind = "drop-response"
	// FaultSlow: the request is processed, then the reply waits
	// [Faults.SlowDelay], longer than a client's timeout should be.
	FaultSlow FaultKind = "slow"
	// FaultUnavailable: 503 with Retry-After before processing.
	FaultUnavailable FaultKind = "unavailable"
	// FaultConflict: a burst of [Faults.ConflictBurst] consecutive 409s
	// ("in progress", with Retry-After) before processing, as when a
	// duplicate of the request is still running.
	FaultConflict FaultKind = "conflict"
	// FaultStored500: the handler fails with 500 without doing the work,
	// and that 500 is stored: every retry with the key gets it replayed, as
	// Stripe does with its 500s.
	FaultStored500 FaultKind = "stored-500"
	// FaultOutage: 503 with Retry-After for every request inside one of
	// [Faults.Outages]' windows.
	FaultOutage FaultKind = "outage"
	// FaultRateLimited: 429 with Retry-After before processing, for a
	// request beyond [Faults.RateLimit].
	FaultRateLimited FaultKind = "rate-limited"
)

// FaultKinds returns every fault kind: the rated kinds in decision order,
// then those decided by the clock (outages are tried first, then the rate
// limit, then the rated kinds).
func FaultKinds() []FaultKind {
	return []FaultKind{FaultDropRequest, FaultDropResponse, FaultSlow, FaultUnavailable, FaultConflict, FaultStored500, FaultOutage, FaultRateLimited}
}

// rated are the kinds drawn per request, in decision order; outages are
// decided by the clock instead.
var rated = [...]FaultKind{FaultDropRequest, FaultDropResponse, FaultSlow, FaultUnavailable, FaultConflict, FaultStored500}

// Faults configures fault injection. Each rate is the probability, from 0
// to 1, that a request gets that fault; kinds are tried in the order of
// [FaultKinds], so rates summing past 1 starve the later kinds.
//
// Decisions are deterministic: each derives from a hash of Seed, the
// request's operation (see [Server]) and the number of requests the
// operation has sent so far, not from a shared random stream. The same
// seed and the same per-operation request sequence give the same faults,
// however requests interleave across operations and goroutines. Requests
// refused by an outage do not count in that number, so outages do not
// shift the decisions that follow them; nor do requests refused by the
// rate limit, which depends on time and is not deterministic. The count is of requests the server
// receives: net/http's Transport silently resends a keyed request once when
// a reused connection closes without a reply, so for a fault sequence that
// is the same run after run, disable keep-alives or count on the server.
//
// The zero value injects nothing.
type Faults struct {
	Seed uint64 // seeds every decision

	DropRequest  float64 // rate of FaultDropRequest
	DropResponse float64 // rate of FaultDropResponse
	Slow         float64 // rate of FaultSlow
	Unavailable  float64 // rate of FaultUnavailable
	Conflict     float64 // rate of FaultConflict bursts
	Stored500    float64 // rate of FaultStored500

	// ConflictBurst is how many consecutive requests of an operation get
	// 409 once a conflict fault starts; 0 means 3.
	ConflictBurst int

	// SlowDelay is how long a slow reply waits; 0 means 2 s. The wait ends
	// early, without a reply, when the client goes away or the server
	// closes, so no handler outlives its connection.
	SlowDelay time.Duration

	// RetryAfter is sent in Retry-After with injected 503s and 409s and
	// with the middleware's own 409s, rounded up to whole seconds; 0 sends
	// "Retry-After: 0" so tests do not wait.
	RetryAfter time.Duration

	// Outages are windows of time, measured from NewServer on the server's
	// clock ([Options.Now]), during which every request gets FaultOutage.
	Outages []Window

	// RateLimit is how many requests a second the server serves, as a
	// token bucket of RateBurst requests (0 means one second's worth,
	// at least 1) on the server's clock; a request beyond it gets 429
	// with Retry-After (FaultRateLimited) and runs nothing. 0 means no
	// limit. Every request counts, dropped and faulted ones included, as
	// a real API's limit counts them.
	RateLimit float64
	RateBurst int

	// Latency delays every request before it is served (before any
	// fault but an outage or the rate limit), as a distant server would.
	// The wait ends early, without a reply and without running anything,
	// when the client goes away or the server closes. 0 means none.
	Latency time.Duration

	// MaxPerOperation caps the rated faults injected into one operation;
	// once reached, its requests are served normally. 0 means no cap. A
	// conflict burst counts as one fault but costs ConflictBurst requests;
	// a client whose attempts exceed the requests the cap can spoil always
	// gets its operation through.
	MaxPerOperation int
}

// Window is a span of time measured from the server's start.
type Window struct {
	Start time.Duration // first instant of the window
	End   time.Duration // first instant after it
}

// opState is what fault decisions remember about one operation.
type opState struct {
	attempts int // requests counted so far
	faults   int // rated faults injected so far
	burst    int // 409s still owed by the current conflict burst
}

// decide returns the fault for the next request of op, or "" for none.
// A request without a key never draws a 409, and neither does the first
// request of an operation: a real server answers "in progress" only to a
// key it is already processing, and a client rightly takes a 409 to a
// key it has never sent before for the application's own conflict. The
// caller holds the server's lock.
func (f *Faults) decide(st *opState, op string, keyed bool) FaultKind {
	st.attempts++
	if st.burst > 0 {
		st.burst--
		return FaultConflict
	}
	if f.MaxPerOperation > 0 && st.faults >= f.MaxPerOperation {
		return ""
	}
	u := unitFloat(f.Seed, op, st.attempts)
	sum := 0.0
	for _, k := range rated {
		sum += max(f.rate(k), 0)
		if u < sum {
			if k == FaultConflict && (!keyed || st.attempts == 1) {
				return ""
			}
			st.faults++
			if k == FaultConflict {
				st.burst = f.conflictBurst() - 1
			}
			return k
		}
	}
	return ""
}

func (f *Faults) rate(k FaultKind) float64 {
	switch k {
	case FaultDropRequest:
		return f.DropRequest
	case FaultDropResponse:
		return f.DropResponse
	case FaultSlow:
		return f.Slow
	case FaultUnavailable:
		return f.Unavailable
	case FaultConflict:
		return f.Conflict
	case FaultStored500:
		return f.Stored500
	}
	return 0
}

func (f *Faults) conflictBurst() int {
	if f.ConflictBurst <= 0 {
		return 3
	}
	return f.ConflictBurst
}

func (f *Faults) slowDelay() time.Duration {
	if f.SlowDelay <= 0 {
		return 2 * time.Second
	}
	return f.SlowDelay
}

// inOutage reports whether elapsed falls in one of the outage windows.
func (f *Faults) inOutage(elapsed time.Duration) bool {
	for _, w := range f.Outages {
		if elapsed >= w.Start && elapsed < w.End {
			return true
		}
	}
	return false
}

// unitFloat maps (seed, op, attempt) to a uniform number in [0, 1): FNV-1a
// over the three, then the SplitMix64 finaliser, whose avalanche makes
// neighbouring attempts independent.
func unitFloat(seed uint64, op string, attempt int) float64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(attempt))
	h.Write(b[:])
	h.Write([]byte(op))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}
