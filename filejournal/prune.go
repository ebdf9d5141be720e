package filejournal

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// pruner prunes a Journal's done entries past their retention in
// the background, so that a process that never restarts stays bounded
// without its owner scheduling anything. It runs from Open
// until Close.
type pruner struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startPruner(j *Journal, every time.Duration) *pruner {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pruner{cancel: cancel}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// A failed prune (the journal broke, or closed) is retried at
			// the next tick; the error is the next writer's to report.
			//
			// The cutoff trusts the clock, and needs no check against the
			// high-water mark (HighWater): a clock set back gives an
			// earlier cutoff, which prunes fewer done entries, never more.
			// Only a clock set forward prunes early, a done entry whose
			// operation a rerun would then send again under a new key;
			// nothing here can tell that clock from a correct one.
			retention := cmp.Or(time.Duration(j.retention.Load()), defaultRetention)
			if now, err := j.nowKept(ctx); err == nil {
				_, _ = j.Prune(ctx, now.Add(-max(retention, j.keepDone)))
			}
		}
	}()
	return p
}

// stop ends the pruner and waits for it.
func (p *pruner) stop() {
	p.cancel()
	p.wg.Wait()
}

// Retain tells the journal how long its Client's server keeps keys
// ([idemhttp.Policy.Retention]): the background pruning then removes done
// entries only after the longest retention it was told, 24 hours until it
// is told one. An [idemhttp.Client] calls it at its first use, so that
// the policy is the one retention setting: pruning a done entry earlier
// than the client expects would let a rerun of its operation mint a new
// key. A d that is not positive is ignored.
func (j *Journal) Retain(d time.Duration) {
	// retention starts at 0, so a first positive d is stored whatever its
	// size, later ones only raise it, and one not positive never is.
	for {
		cur := j.retention.Load()
		if int64(d) <= cur || j.retention.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}
