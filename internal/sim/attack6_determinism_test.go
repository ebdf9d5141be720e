package sim

import (
	"os"
	"sync"
	"testing"
)

// Seed 796 (ops=3, dups=2, concurrent=true) gives two traces when its
// runs share the machine: calls 6 and 7, both of operation 0, wait for
// the slot that call 5's resend holds (senders.acquire); its release
// closes one channel and both waiters wake at once, and which takes the
// slot first is the Go scheduler's choice, not the world's. Both read
// the done entry, so no invariant breaks, but the trace hash differs
// (TestSimDeterminism -sim.determinism=2000 reported it; the code before
// the power-cut reboots, 1ed0c1f^, does the same). A hand-off of the
// slot to its first waiter, in the order they began waiting, would make
// it deterministic (and fair); that is a change to the client's hot path,
// left to its owner.
func TestAttack6SlotWakeupOrderIsNotTheWorlds(t *testing.T) {
	if os.Getenv("ATTACK6_SLOT_ORDER") == "" {
		t.Skip("attack6: two waiters for one slot wake in the scheduler's order: seed 796's trace varies under load (set ATTACK6_SLOT_ORDER=1 to run)")
	}
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
