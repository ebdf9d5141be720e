package inbox

import (
	"context"
	"sync"
	"time"
)

// Supervision is how [Supervise] watches one handler call: a processing
// limit, and heartbeats while the handler runs. The broker adapters use
// it; its zero value watches nothing.
type Supervision struct {
	// Limit bounds the handler's run: its context ends then, and Release
	// is called. Zero or negative means no limit.
	Limit time.Duration
	// Every is the interval of Beat; zero or negative means no beats.
	Every time.Duration
	// Beat, when set, is called every Every while the handler runs and
	// the limit has not passed (a NATS AckProgress, an SQS visibility
	// extension).
	Beat func()
	// Release, when set, is called once if the limit passes before the
	// handler returns: it hands the message back to the broker, for
	// another consumer (a requeue, a nak, a visibility of zero). The
	// handler may still be running, and may still return nil.
	Release func()
}

// Supervise calls h(ctx, m) under s and returns its error, and whether the
// limit passed first, in which case Release has run and the caller must
// not settle the message again (its delivery is spent). Beat and Release
// run on a goroutine of Supervise's, never at the same time, and never
// after Supervise returns; h runs on the caller's. A ctx that ends does
// not release the message: h is expected to return, and the caller to
// settle it.
func Supervise(ctx context.Context, h Handler, m *Message, s Supervision) (released bool, err error) {
	hctx := ctx
	var deadline time.Time
	var limitC <-chan struct{}
	if s.Limit > 0 {
		deadline = time.Now().Add(s.Limit)
		var cancel context.CancelFunc
		hctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
		limitC = hctx.Done()
	}
	var beatC <-chan time.Time
	if s.Every > 0 && s.Beat != nil {
		t := time.NewTicker(s.Every)
		defer t.Stop()
		beatC = t.C
	}
	if limitC == nil && beatC == nil {
		return false, h(ctx, m)
	}
	var mu sync.Mutex // released, and whether h returned
	returned := false
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var late <-chan time.Time // the limit, when ctx ended before it
		for {
			select {
			case <-done:
				return
			case <-beatC:
				s.Beat()
				continue
			case <-limitC:
				if ctx.Err() != nil {
					// A shutdown, not the limit: the message stays, to be
					// settled once h returns, unless h outlives the limit
					// too.
					limitC = nil
					t := time.NewTimer(time.Until(deadline))
					defer t.Stop()
					late = t.C
					continue
				}
			case <-late:
			}
			// The limit passed, and h's context with it.
			mu.Lock()
			if returned {
				mu.Unlock()
				return
			}
			released = true
			mu.Unlock()
			if s.Release != nil {
				s.Release()
			}
			return
		}
	})
	err = h(hctx, m)
	mu.Lock()
	returned = true
	mu.Unlock()
	close(done)
	wg.Wait()
	return released, err
}
