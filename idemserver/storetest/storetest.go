// Package storetest is the conformance suite for [idemserver.Store]
// implementations. A store passes when
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) idemserver.Store { return newStore(t) })
//	}
//
// succeeds with -race. Stores that keep time with an injected clock use
// [RunWithClock] instead, which checks expiry without waiting.
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// wallUnit is the time step of [Run]: long enough that a busy machine
// cannot stretch the gap between two store calls past it, short enough
// that the suite's waits add up to about two seconds.
const wallUnit = 100 * time.Millisecond

// Run runs the conformance suite against stores that keep wall-clock time
// (Redis's PX, PostgreSQL's now()). newStore must return a new, empty store
// for each subtest; register any cleanup with t.Cleanup. The tests of lock
// timeouts and TTLs wait for real time to pass, in steps of 100 ms.
func Run(t *testing.T, newStore func(t *testing.T) idemserver.Store) {
	t.Helper()
	run(t, harness{
		unit: wallUnit,
		newStore: func(t *testing.T) (idemserver.Store, func(time.Duration)) {
			return newStore(t), time.Sleep
		},
	})
}

// RunWithClock runs the conformance suite against stores that read time
// from an injected clock, such as [idemserver.MemoryStore] with its Now
// field. newStore must return a new, empty store that reads the time from
// now; the suite moves that clock forward instead of waiting.
func RunWithClock(t *testing.T, newStore func(t *testing.T, now func() time.Time) idemserver.Store) {
	t.Helper()
	run(t, harness{
		unit: time.Minute,
		newStore: func(t *testing.T) (idemserver.Store, func(time.Duration)) {
			c := &clock{t: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
			return newStore(t, c.now), c.advance
		},
	})
}

// clock is a fake clock that moves only when told to.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type harness struct {
	unit     time.Duration
	newStore func(t *testing.T) (s idemserver.Store, advance func(time.Duration))
}

// fixture is one subtest's store with helpers that fail the test on
// unexpected errors.
type fixture struct {
	t       *testing.T
	s       idemserver.Store
	advance func(time.Duration)
	unit    time.Duration
	ctx     context.Context
}

func (h harness) fixture(t *testing.T) *fixture {
	s, advance := h.newStore(t)
	require.NotNil(t, s, "newStore returned nil")
	return &fixture{t: t, s: s, advance: advance, unit: h.unit, ctx: context.Background()}
}

// lock is the lock timeout of every claim in the suite: four units, so a
// check one unit after claiming is far from the boundary.
func (f *fixture) lock() time.Duration { return 4 * f.unit }

func (f *fixture) claim(key, token, fp string) idemserver.ClaimResult {
	f.t.Helper()
	res, err := f.s.Claim(f.ctx, key, idemserver.Claim{Token: token, Fingerprint: fp, LockTimeout: f.lock()})
	require.NoError(f.t, err, "Claim(%q, token %q)", key, token)
	return res
}

func (f *fixture) mustClaim(key, token, fp string) {
	f.t.Helper()
	res := f.claim(key, token, fp)
	require.Equal(f.t, idemserver.Claimed, res.State, "Claim(%q, token %q) on a free key", key, token)
}

func (f *fixture) complete(key, token string, record []byte) error {
	return f.s.Complete(f.ctx, key, token, record, 4*f.unit)
}

func (f *fixture) release(key, token string) error {
	return f.s.Release(f.ctx, key, token)
}

func (f *fixture) renew(key, token string) error {
	return f.s.Renew(f.ctx, key, token, f.lock())
}

// record returns a response record with the given body, as the
// middleware would store it.
func record(body string) []byte {
	r := &idemserver.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Set-Cookie":   {"a=1", "b=2"},
		},
		Body: []byte(body),
	}
	b, err := r.MarshalBinary()
	if err != nil {
		panic(err) // unreachable: the status is valid
	}
	return b
}

func run(t *testing.T, h harness) {
	t.Run("ClaimFreeKey", func(t *testing.T) {
		f := h.fixture(t)
		res := f.claim("k", "t1", "fp1")
		assert.Equal(t, idemserver.ClaimResult{State: idemserver.Claimed}, res, "no fingerprint, no record")
	})

	t.Run("ClaimHeldKey", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp1")
		res := f.claim("k", "t2", "fp2")
		assert.Equal(t, idemserver.InProgress, res.State)
		assert.Equal(t, "fp1", res.Fingerprint, "the first claimer's fingerprint")
		assert.Nil(t, res.Record)
	})

	t.Run("CompleteThenReplay", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp1")
		require.NoError(t, f.complete("k", "t1", record(`{"id":1}`)))
		res := f.claim("k", "t2", "fp1")
		require.Equal(t, idemserver.Completed, res.State)
		assert.Equal(t, "fp1", res.Fingerprint)
		assert.Equal(t, record(`{"id":1}`), res.Record)
	})

	t.Run("RecordFidelity", func(t *testing.T) {
		tests := []struct {
			name string
			give []byte
		}{
			{"one byte", []byte{1}},
			{"every byte value", func() []byte {
				b := make([]byte, 512)
				for i := range b {
					b[i] = byte(i)
				}
				return b
			}()},
			{"trailing NULs", []byte("record\x00\x00")},
			{"invalid UTF-8", []byte{1, 0xff, 0xfe, 0xc3, 0x28}},
			{"1 MiB", []byte(strings.Repeat("x", 1<<20))},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f := h.fixture(t)
				f.mustClaim("k", "t1", "fp")
				require.NoError(t, f.complete("k", "t1", bytes.Clone(tt.give)))
				res := f.claim("k", "t2", "fp")
				require.Equal(t, idemserver.Completed, res.State)
				// bytes.Equal, not assert.Equal: a diff of 1 MiB takes seconds.
				assert.True(t, bytes.Equal(tt.give, res.Record), "the record changed: %d bytes stored, %d returned", len(tt.give), len(res.Record))
			})
		}
	})

	t.Run("TokenChecks", func(t *testing.T) {
		tests := []struct {
			name  string
			give  func(f *fixture) error // the call under test, after "t1" claimed "k"
			want  error
			state idemserver.ClaimState // what a later Claim of "k" finds
		}{
			{"complete with another token", func(f *fixture) error { return f.complete("k", "t2", record("x")) }, idemserver.ErrClaimLost, idemserver.InProgress},
			{"release with another token", func(f *fixture) error { return f.release("k", "t2") }, idemserver.ErrClaimLost, idemserver.InProgress},
			{"complete twice", func(f *fixture) error {
				require.NoError(f.t, f.complete("k", "t1", record("x")))
				return f.complete("k", "t1", record("y"))
			}, idemserver.ErrClaimLost, idemserver.Completed},
			{"release after complete", func(f *fixture) error {
				require.NoError(f.t, f.complete("k", "t1", record("x")))
				return f.release("k", "t1")
			}, idemserver.ErrClaimLost, idemserver.Completed},
			{"release twice", func(f *fixture) error {
				require.NoError(f.t, f.release("k", "t1"))
				return f.release("k", "t1")
			}, idemserver.ErrClaimLost, idemserver.Claimed},
			{"complete after release", func(f *fixture) error {
				require.NoError(f.t, f.release("k", "t1"))
				return f.complete("k", "t1", record("x"))
			}, idemserver.ErrClaimLost, idemserver.Claimed},
			{"complete unknown key", func(f *fixture) error { return f.complete("other", "t1", record("x")) }, idemserver.ErrClaimLost, idemserver.InProgress},
			{"release unknown key", func(f *fixture) error { return f.release("other", "t1") }, idemserver.ErrClaimLost, idemserver.InProgress},
			{"release frees the key", func(f *fixture) error { return f.release("k", "t1") }, nil, idemserver.Claimed},
			{"renew keeps the claim", func(f *fixture) error { return f.renew("k", "t1") }, nil, idemserver.InProgress},
			{"renew with another token", func(f *fixture) error { return f.renew("k", "t2") }, idemserver.ErrClaimLost, idemserver.InProgress},
			{"renew unknown key", func(f *fixture) error { return f.renew("other", "t1") }, idemserver.ErrClaimLost, idemserver.InProgress},
			{"renew after complete", func(f *fixture) error {
				require.NoError(f.t, f.complete("k", "t1", record("x")))
				return f.renew("k", "t1")
			}, idemserver.ErrClaimLost, idemserver.Completed},
			{"renew after release", func(f *fixture) error {
				require.NoError(f.t, f.release("k", "t1"))
				return f.renew("k", "t1")
			}, idemserver.ErrClaimLost, idemserver.Claimed},
			{"complete after renew", func(f *fixture) error {
				require.NoError(f.t, f.renew("k", "t1"))
				return f.complete("k", "t1", record("x"))
			}, nil, idemserver.Completed},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f := h.fixture(t)
				f.mustClaim("k", "t1", "fp")
				err := tt.give(f)
				if tt.want == nil {
					assert.NoError(t, err)
				} else {
					assert.ErrorIs(t, err, tt.want)
				}
				assert.Equal(t, tt.state, f.claim("k", "t3", "fp").State)
			})
		}
	})

	t.Run("CompletedResponseUnchangedByLaterCalls", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp")
		require.NoError(t, f.complete("k", "t1", record("first")))
		assert.ErrorIs(t, f.complete("k", "t1", record("second")), idemserver.ErrClaimLost)
		res := f.claim("k", "t2", "other-fp")
		require.Equal(t, idemserver.Completed, res.State)
		assert.Equal(t, "fp", res.Fingerprint)
		assert.Equal(t, record("first"), res.Record)
	})

	t.Run("LockHeldUntilTimeout", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp")
		f.advance(f.unit)
		assert.Equal(t, idemserver.InProgress, f.claim("k", "t2", "fp").State)
		assert.NoError(t, f.complete("k", "t1", record("x")), "the claim is still live")
	})

	t.Run("LockTimeoutTakeover", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "stale", "fp-old")
		f.advance(f.lock() + f.unit)
		res := f.claim("k", "fresh", "fp-new")
		require.Equal(t, idemserver.Claimed, res.State, "an abandoned claim is taken over")
		assert.ErrorIs(t, f.complete("k", "stale", record("stale")), idemserver.ErrClaimLost, "a stale token cannot complete the newer claim")
		assert.ErrorIs(t, f.release("k", "stale"), idemserver.ErrClaimLost, "a stale token cannot release the newer claim")
		held := f.claim("k", "third", "fp-new")
		assert.Equal(t, idemserver.InProgress, held.State)
		assert.Equal(t, "fp-new", held.Fingerprint)
		require.NoError(t, f.complete("k", "fresh", record("fresh")))
		done := f.claim("k", "fourth", "fp-new")
		require.Equal(t, idemserver.Completed, done.State)
		assert.Equal(t, record("fresh"), done.Record)
	})

	t.Run("RenewExtendsLock", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp")
		// Renewed three units in, the claim outlives its first lock
		// timeout (four units) by two units at least.
		f.advance(3 * f.unit)
		require.NoError(t, f.renew("k", "t1"))
		f.advance(3 * f.unit)
		held := f.claim("k", "t2", "fp2")
		assert.Equal(t, idemserver.InProgress, held.State, "a renewed claim holds its key past the first lock timeout")
		assert.Equal(t, "fp", held.Fingerprint)
		require.NoError(t, f.complete("k", "t1", record("slow")), "a renewed claim completes")
		done := f.claim("k", "t3", "fp")
		require.Equal(t, idemserver.Completed, done.State)
		assert.Equal(t, record("slow"), done.Record)
	})

	t.Run("RenewedClaimStillExpires", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp")
		f.advance(f.unit)
		require.NoError(t, f.renew("k", "t1"))
		f.advance(f.lock() + f.unit)
		assert.ErrorIs(t, f.renew("k", "t1"), idemserver.ErrClaimLost, "an expired claim is not revived")
		assert.Equal(t, idemserver.Claimed, f.claim("k", "t2", "fp").State)
		assert.ErrorIs(t, f.renew("k", "t1"), idemserver.ErrClaimLost, "a stale token cannot renew the newer claim")
	})

	t.Run("ExpiredClaimCannotComplete", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp")
		f.advance(f.lock() + f.unit)
		assert.ErrorIs(t, f.complete("k", "t1", record("late")), idemserver.ErrClaimLost)
		assert.ErrorIs(t, f.release("k", "t1"), idemserver.ErrClaimLost)
		assert.Equal(t, idemserver.Claimed, f.claim("k", "t2", "fp").State, "the late response was not stored")
	})

	t.Run("TTL", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "t1", "fp")
		require.NoError(t, f.s.Complete(f.ctx, "k", "t1", record("x"), 4*f.unit))
		f.advance(f.unit)
		assert.Equal(t, idemserver.Completed, f.claim("k", "t2", "fp").State, "within the TTL")
		f.advance(4 * f.unit)
		assert.Equal(t, idemserver.Claimed, f.claim("k", "t3", "fp2").State, "after the TTL the key is free")
	})

	t.Run("KeysAreDistinct", func(t *testing.T) {
		f := h.fixture(t)
		keys := []string{
			"a", "A", "a ", " a", "ab", "a\x00b", "a\x00", "\xff\xfe",
			"0:a:b", "1:a:b", "é", strings.Repeat("k", 600), strings.Repeat("k", 601),
		}
		for i, k := range keys {
			f.mustClaim(k, fmt.Sprint("t", i), fmt.Sprint("fp", i))
		}
		for i, k := range keys {
			require.NoError(t, f.complete(k, fmt.Sprint("t", i), record(fmt.Sprint("body", i))), "key %q", k)
		}
		for i, k := range keys {
			res := f.claim(k, "again", "")
			require.Equal(t, idemserver.Completed, res.State, "key %q", k)
			assert.Equal(t, fmt.Sprint("fp", i), res.Fingerprint, "key %q", k)
			assert.Equal(t, record(fmt.Sprint("body", i)), res.Record, "key %q", k)
		}
	})

	t.Run("ConcurrentClaimsOneWinner", func(t *testing.T) {
		f := h.fixture(t)
		assert.Equal(t, 1, claimRace(f, "k"))
	})

	t.Run("ConcurrentTakeoverOneWinner", func(t *testing.T) {
		f := h.fixture(t)
		f.mustClaim("k", "abandoned", "fp")
		f.advance(f.lock() + f.unit)
		assert.Equal(t, 1, claimRace(f, "k"))
	})
}

// claimRace claims key from 32 goroutines at once and returns how many won.
// The racers' claims hold for an hour, not the suite's four units: the race
// tests that a live claim excludes the others, and with a short lock a
// loaded machine let one expire between two racers (two winners, seen once
// at load average 12 on the PostgreSQL store) without any store being wrong.
func claimRace(f *fixture, key string) int {
	f.t.Helper()
	const n = 32
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		mu    sync.Mutex
		wins  int
		errs  []error
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := f.s.Claim(f.ctx, key, idemserver.Claim{Token: fmt.Sprint("racer", i), Fingerprint: "fp", LockTimeout: time.Hour})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if res.State == idemserver.Claimed {
				wins++
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(f.t, errs)
	return wins
}
