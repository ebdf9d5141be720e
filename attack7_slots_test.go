package idemhttp

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/idemtrace"
)

// The FIFO handover under cancellation: goroutines take one slot, hold it
// a moment and release it, while many give up waiting (some with a
// context already done, some as the slot is handed to them). Never two
// holders at once, nothing left held or queued, no waiter stranded.
// Checked to fail (a waiter stranded) with acquire not passing on a slot
// handed to it as its context ended.
func TestAttack7SlotHandoverUnderCancellation(t *testing.T) {
	var s senders
	id := slotID{scope: t.Name(), kind: 'k', id: "k"}
	var holders, maxHolders, granted atomic.Int32
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 200 {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch rng.IntN(4) {
				case 0:
					ctx, cancel = context.WithCancel(context.Background())
					cancel() // done before it asks
				case 1:
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(50))*time.Microsecond)
				}
				_, err := s.acquire(ctx, id)
				cancel()
				if err != nil {
					continue
				}
				granted.Add(1)
				n := holders.Add(1)
				for {
					m := maxHolders.Load()
					if n <= m || maxHolders.CompareAndSwap(m, n) {
						break
					}
				}
				if rng.IntN(2) == 0 {
					time.Sleep(time.Duration(rng.IntN(20)) * time.Microsecond)
				}
				holders.Add(-1)
				s.release(id)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("a waiter was stranded")
	}
	assert.EqualValues(t, 1, maxHolders.Load(), "one holder at a time")
	assert.Positive(t, granted.Load())
	assert.Zero(t, s.held(t.Name()), "nothing left held")
	assert.Zero(t, s.waiters(t.Name()), "nothing left queued")
}

// Three Clients share one journal; calls of a few operations run at once
// with random deadlines, hooks that panic now and then, a server that
// drops some answers and stalls others, and Resume from each Client at the
// same time. Whatever happens, each operation reaches the server under at
// most one key (a second key would be a second effect), and no slot is
// left held or waited for. Checked to fail, two runs in four, with
// hold taking no slot (as the planted noslots bug).
func TestAttack7ThreeClientsOneJournal(t *testing.T) {
	var mu sync.Mutex
	keysOf := map[string]map[string]bool{} // operation (the body) -> keys that reached the handler
	var n atomic.Int64
	srv := newScripted(t, func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) % 5 {
		case 0:
			drop(w, r)
		case 1:
			time.Sleep(2 * time.Millisecond)
			w.WriteHeader(201)
		default:
			w.WriteHeader(201)
		}
	})
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		if keysOf[string(b)] == nil {
			keysOf[string(b)] = map[string]bool{}
		}
		keysOf[string(b)][r.Header.Get("Idempotency-Key")] = true
		mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		srv.serve(w, r)
	})
	j := newRecJournal()
	var boom atomic.Int64
	hooks := &idemtrace.Hooks{OnAttempt: func(context.Context, idemtrace.AttemptEvent) {
		if boom.Add(1)%13 == 0 {
			panic(errPanicHook)
		}
	}}
	clients := []*Client{
		{Journal: j, Policy: fast()},
		{Journal: j, Policy: &Policy{MaxAttempts: 1}, Hooks: hooks},
		{Journal: j, Policy: fast(), Hooks: hooks},
	}
	var wg sync.WaitGroup
	for g := range 9 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for range 30 {
				c := clients[rng.IntN(len(clients))]
				op := fmt.Sprintf("op-%d", rng.IntN(16))
				ctx, cancel := context.WithTimeout(WithOperation(context.Background(), op), time.Duration(1+rng.IntN(4))*time.Millisecond)
				func() {
					defer func() { _ = recover() }()
					defer cancel()
					if rng.IntN(5) == 0 {
						_, _ = c.Resume(ctx, nil)
						return
					}
					resp, err := c.Do(post(t, srv.URL, op).WithContext(ctx))
					if err == nil {
						resp.Body.Close()
					}
				}()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("requests %d, operations %v", n.Load(), keysOf)
	assert.NotEmpty(t, keysOf)
	for op, keys := range keysOf {
		assert.LessOrEqual(t, len(keys), 1, "operation %s reached the server under %d keys", op, len(keys))
	}
	assert.Zero(t, slots.held(j), "no slot left held")
	assert.Zero(t, slots.waiters(j), "no waiter left")
}
