//go:build go1.26

package sim

import (
	"slices"
	"time"
)

// The server process's own clock (issue 32 §1.3), apart from the store's.
//
// idemserver.Middleware reads its process's clock for a claim's lock
// arithmetic: when a renewal is due, until when the store holds the
// claim, how long a Complete after the handler is tried again, the
// deadline of each store call. The world gives each streamed server
// process a clock of its own (through internal/serverclock) and, in the
// seeds that draw it (Config.ProcJumps), sets it back, by a second to
// two minutes (past the 3 s lock timeout, past the 1 s Retry-After) or by
// one to twenty-five hours (past the 24 h TTL), or forward, by 0.1 to
// 0.8 s. The store's clock (server_faults.go) does not move with it.
//
// The readings of a real process's time.Now carry the runtime's
// monotonic clock, which no setting of the wall clock moves, and every
// comparison the Middleware makes is between two of its own readings:
// a real jump moves none of them. The world's clock jumps in every
// reading, as a clock without that evidence would: the Middleware must
// hold the invariants on it all the same, its renewals carrying on from
// the latest reading after a set-back (idemserver/renew.go's
// steadyClock), so that no future change that strips a reading of its
// monotonic part (a Round(0), a UTC(), a time that went through a store)
// can let a set-back starve a claim of its renewals. The transactional
// shell reads no clock of its process (its bounds are durations), so
// only the streamed world draws these jumps.
//
// Why forward jumps are short: a clock without monotonic evidence set
// forward is, to the process, time passing; the Middleware then takes a
// live claim's lock for run out, tries a Complete that fails for a tenth
// of the lock timeout only, and leaves the claim to the store's lock,
// which a retry outlives and runs beside: the known limit of a process
// paused past its lock timeout (the store's forward jumps are kept short
// for the same reason), not what a real process meets, whose readings a
// setting of the clock does not move. The first 4,000 seeds met it twice
// with jumps of hours, before they were kept short.

// now is process p's clock: virtual time plus its jumps.
func (p *serverProc) now() time.Time {
	return time.Now().Add(time.Duration(p.off.Load()))
}

// procJumpWeight is the weight of a jump of a server process's clock
// among the driver's steps: none once the seed's jumps are spent (or in
// the transactional world), more while a handler is held (its claim is
// live, renewed on that clock: where a jump matters).
func (w *world) procJumpWeight() int {
	if w.cfg.Shell != shellStreamed || w.procJumps >= w.cfg.ProcJumps || len(w.servers()) == 0 {
		return 0
	}
	if len(w.heldProcs()) > 0 {
		return 4
	}
	return 1
}

// heldProcs returns the server processes up that hold a handler, in the
// order their handlers were held.
func (w *world) heldProcs() []*serverProc {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*serverProc
	for _, g := range w.gates {
		if !g.proc.dead.Load() && !slices.Contains(out, g.proc) {
			out = append(out, g.proc)
		}
	}
	return out
}

// jumpProcClock sets the clock of a server process, drawn by the driver
// (one holding a handler, if any does), back or forward.
func (w *world) jumpProcClock() {
	w.procJumps++
	up := w.heldProcs()
	if len(up) == 0 {
		up = w.servers()
	}
	p := up[w.rng.intn(len(up))]
	var d time.Duration
	switch w.rng.intn(3) {
	case 0:
		d = -time.Duration(1+w.rng.intn(120)) * time.Second
	case 1:
		d = -time.Duration(1+w.rng.intn(25)) * time.Hour
	default:
		d = time.Duration(100+w.rng.intn(700)) * time.Millisecond
	}
	if d > 0 {
		w.count("server clock forward")
	} else {
		w.count("server clock back")
	}
	p.off.Add(int64(d))
	w.tracef("server %d's clock jumps %v", p.n, d)
}
