//go:build go1.26

package sim

import (
	"sync"
	"testing"
)

// Seed 796 (ops=3, dups=2, concurrent=true) gave two traces when its
// runs shared the machine: calls 6 and 7, both of operation 0, waited for
// the slot that call 5's resend held (senders.acquire); its release closed
// one channel and both waiters woke at once, and which took the slot
// first was the Go scheduler's choice, not the world's. Both read the done
// entry, so no invariant broke, but the trace hash differed. Fixed: a
// release hands the slot to its first waiter (senders.go). Twelve runs at
// once must agree; checked to fail with release waking every waiter
// (closing one channel), as before: 2 hashes, in one run of three on a
// quiet machine.
func TestAttack6SlotWakeupOrderIsTheWorlds(t *testing.T) {
	const seed = 796
	cfg, err := ParseConfig(ConfigFor(seed), "")
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]string, 12)
	var wg sync.WaitGroup
	for i := range hashes {
		wg.Go(func() { hashes[i] = RunSeed(t, seed, cfg).Hash })
	}
	wg.Wait()
	for _, h := range hashes[1:] {
		if h != hashes[0] {
			t.Fatalf("seed %d gave two traces: %v", seed, hashes)
		}
	}
}
