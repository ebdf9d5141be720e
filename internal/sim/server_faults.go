//go:build go1.26

package sim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idemhttp/internal/servermodel"
)

// The faults of the server's database (of its store, in the streamed
// world), all drawn from the seed, none from wall time:
//
//   - a call refused, refused for lack of room (a Redis past maxmemory),
//     or done with its answer lost; in the transactional world, also a
//     call that hangs until the shell's bound (Config.StoreFault);
//   - a partition: every call begun in it hangs until its bound, for a
//     while of virtual time the seed draws (Config.Partitions);
//   - the database's clock jumping (Config.StoreJumps).
//
// The streamed world's store keeps its claims on a lock timeout measured
// by its own clock, which the Middleware renews every tenth of it, so
// that a store cut off (or a clock jumping forward) for less than most of
// the lock timeout loses no claim; for longer, a claim whose handler has
// charged may expire and a retry run beside it, which no renewal can
// prevent: what the Store contract asks of a store. Its partitions last
// at most a second, and its clock jumps forward once at most, by under a
// second (and back by seconds: a claim lives that much longer). The
// transactional world's claims are the database's locks, which no clock
// ends: its partitions last up to ten seconds, its clock jumps by
// minutes.

// storeClock is the database's clock: virtual time, plus its jumps.
func (w *world) storeClock() time.Time {
	return time.Now().Add(time.Duration(w.srvOff.Load()))
}

// storeFault decides the fault of a call of the store (a statement of
// the database): from a hash of the seed, the call and how many calls of
// its kind the key had (so that two goroutines' calls at one instant get
// the same faults whatever order they come in).
func (w *world) storeFault(op servermodel.Op, key string) servermodel.Fault {
	if !w.faulty.Load() {
		return servermodel.Pass
	}
	now := time.Now()
	if until := w.partUntil.Load(); until != 0 && now.UnixNano() < until {
		w.count("store call hangs in a partition")
		w.storeNote(now, "store: %s %s hangs: the store is cut off", op, key)
		return servermodel.Hang
	}
	if w.cfg.StoreFault <= 0 {
		return servermodel.Pass
	}
	w.mu.Lock()
	w.storeCalls[string(op)+" "+key]++
	n := w.storeCalls[string(op)+" "+key]
	w.mu.Unlock()
	if w.draw(1000, "store", op, key, n) >= w.cfg.StoreFault {
		return servermodel.Pass
	}
	kinds := []servermodel.Fault{servermodel.Refuse, servermodel.Full, servermodel.Lose}
	if w.cfg.Shell != shellStreamed {
		kinds = append(kinds, servermodel.Hang)
	}
	f := kinds[w.draw(len(kinds), "store fault", op, key, n)]
	name := [...]string{servermodel.Refuse: "refused", servermodel.Full: "out of memory", servermodel.Lose: "answer lost", servermodel.Hang: "hangs"}[f]
	w.count("store " + string(op) + " " + name)
	w.storeNote(now, "store: %s %s (%d): %s", op, key, n, name)
	return f
}

// storeNote keeps a line for the trace: the driver writes the lines of a
// step in order of time and text (storeNotes), whatever order the
// goroutines that made them ran in.
func (w *world) storeNote(at time.Time, format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.snotes = append(w.snotes, stamped{at: at, line: fmt.Sprintf(format, args...)})
}

// flushStoreNotes writes the store's lines of the last step.
func (w *world) flushStoreNotes() {
	w.mu.Lock()
	ns := w.snotes
	w.snotes = nil
	w.mu.Unlock()
	slices.SortFunc(ns, func(a, b stamped) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return strings.Compare(a.line, b.line)
	})
	for _, n := range ns {
		w.traceAt(n.at, "%s", n.line)
	}
}

// partition cuts the store off for a while.
func (w *world) partition() {
	w.partitions++
	d := time.Duration(100+w.rng.intn(900)) * time.Millisecond
	if w.cfg.Shell != shellStreamed {
		d = time.Duration(100+w.rng.intn(9900)) * time.Millisecond
	}
	w.count("store partition")
	w.tracef("the store is cut off for %v", d)
	w.partUntil.Store(time.Now().Add(d).UnixNano())
}

// partitionDue reports whether the store may be cut off now. In the
// streamed world, not within a lock timeout of the end of the last
// partition: two partitions close together, with the calls begun in the
// first hanging to their bounds, left no renewal through for a whole
// lock, which ran out after the handler had charged, and a retry charged
// again (seed 714117 of a million). A store unreachable for a lock after
// the handler is the non-atomic mode's stated limit (docs/server.md), not
// what the world holds the Middleware to; one partition, within the
// renewals' margin, is.
func (w *world) partitionDue() bool {
	if w.cfg.Shell != shellStreamed {
		return true
	}
	until := w.partUntil.Load()
	return until == 0 || !time.Now().Before(time.Unix(0, until).Add(lockTimeout))
}

// jumpStoreClock sets the database's clock forward or back.
func (w *world) jumpStoreClock() {
	w.storeJumps++
	var d time.Duration
	streamed := w.cfg.Shell == shellStreamed
	switch forward := w.rng.intn(2) == 0; {
	case forward && streamed && !w.storeForward:
		w.storeForward = true
		d = time.Duration(100+w.rng.intn(700)) * time.Millisecond
	case forward && !streamed:
		d = time.Duration(1+w.rng.intn(600)) * time.Second
	case streamed:
		d = -time.Duration(1+w.rng.intn(20)) * time.Second
	default:
		d = -time.Duration(1+w.rng.intn(60)) * time.Minute
	}
	if d > 0 {
		w.count("store clock forward")
	} else {
		w.count("store clock back")
	}
	w.srvOff.Add(int64(d))
	w.tracef("the store's clock jumps %v", d)
}

// hangWait is the store's and the database's Wait: a call that hangs
// waits until its bound, and then a few more nanoseconds, drawn from a
// hash of the seed and the call's name (its request's: the server's
// connection and the request's number on it), so that two calls whose
// bounds end at one instant (two claims begun at one instant in a
// partition) go on one after the other, in an order the seed gives, not
// the scheduler. (Waiting for the driver instead would hold a call past
// its bound for as long as the driver sleeps: a claim's Complete held
// past its lock.)
func (w *world) hangWait(ctx context.Context, op servermodel.Op, key string) {
	<-ctx.Done()
	req := ""
	if rs, ok := ctx.Value(reqKey{}).(*reqState); ok {
		req = rs.id
	}
	name := req + " " + string(op) + " " + key
	w.mu.Lock()
	w.hungN[name]++
	n := w.hungN[name]
	w.mu.Unlock()
	time.Sleep(time.Duration(1+w.draw(999_999, "hang", name, n)) * time.Nanosecond)
}
