package servercore

import "sync/atomic"

// Phase is where a keyed request stands. A request starts Claiming; the
// terminal phases are Answered, Stored, Released, Unsettled, Pinned and Lost.
// docs/server.md draws the moves and the evidence of each.
type Phase uint8

// The phases of a keyed request.
const (
	// Claiming: the request holds nothing yet; its claim is under way.
	Claiming Phase = iota
	// Running: the key is claimed and the handler runs.
	Running
	// Completing: the record is being kept: Complete, retried while the
	// claim's lock is live (Streamed), or the store with COMMIT
	// (Transactional).
	Completing
	// Releasing: the claim is being given up: Release (Streamed), or the
	// rollback (Transactional), perhaps followed by a fresh look at the
	// key.
	Releasing
	// Marking: Transactional only: the handler ended the transaction
	// itself, so what it committed is unknown: the key is being kept as
	// completed, not replayable.
	Marking
	// Answered: terminal: answered without running the handler (409, 422,
	// a replay, 410, 503), or, after a rollback, as a duplicate would be.
	Answered
	// Stored: terminal: the record is kept, a response to replay or the
	// marker of one that cannot be (410).
	Stored
	// Released: terminal: the key is free, and nothing of the handler's
	// remains (Transactional: rolled back), or its response is not one to
	// keep (Streamed: a 5xx, a panic, a handler that gave up).
	Released
	// Unsettled: terminal: the store did not say what became of the key. The
	// claim is left to its lock (Streamed), or the commit's outcome is
	// unknown (Transactional): a retry gets 409 until one or the other
	// shows, never a second run of an effect that committed.
	Unsettled
	// Pinned: terminal, Streamed only: the response could not be stored
	// before the claim's lock ran out, but the claim was kept for the TTL
	// instead, so that the key answers 409 rather than run again.
	Pinned
	// Lost: terminal: the claim was gone when its record was to be kept
	// or released (its lock ran out and perhaps another request took the
	// key over); nothing more can be done for it.
	Lost
	// Again: Transactional only: rolled back by a serialization failure or
	// a deadlock, with a run again allowed; the request claims the key
	// anew.
	Again
)

var phaseNames = [...]string{"claiming", "running", "completing", "releasing", "marking", "answered", "stored", "released", "unsettled", "pinned", "lost", "again"}

// String returns the phase's name.
func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase?"
}

// Terminal reports whether a request in phase p is done.
func (p Phase) Terminal() bool {
	switch p {
	case Answered, Stored, Released, Unsettled, Pinned, Lost:
		return true
	}
	return false
}

// A move allowed in mode s (Streamed), t (Transactional), or both.
const (
	s = 1 << Streamed
	t = 1 << Transactional
)

// moves is the table of allowed moves: moves[from][to] is the set of
// modes in which from → to may happen. Every other move is refused (see
// advance). The moves that must never happen, whatever the evidence:
//
//   - anything out of a terminal phase but Again → Claiming;
//   - Claiming → Completing or Releasing: a record kept, or a claim
//     given up, without a run;
//   - Completing → Releasing or Released in Streamed mode: the handler's
//     effect happened, so a Complete that failed must never free the key
//     for a second run (Pinned or Unsettled instead);
//   - Marking → Released: a handler that ended its transaction may have
//     committed its effect;
//   - Running → Answered, Stored or Released: every end of a run goes
//     through the store (or the transaction).
var moves = [...][Again + 1]uint8{
	Claiming:   {Running: s | t, Answered: s | t},
	Running:    {Completing: s | t, Releasing: s | t, Marking: t},
	Completing: {Completing: s, Stored: s | t, Pinned: s, Unsettled: s | t, Lost: s, Marking: t, Releasing: t},
	Releasing:  {Releasing: s | t, Released: s | t, Unsettled: s, Lost: s, Marking: t, Answered: t, Again: t},
	Marking:    {Stored: t, Unsettled: t},
	Again:      {Claiming: t},
}

// refused counts the moves the table refused, in every request of the
// process: a test's TestMain checks that it stays zero.
var refused atomic.Int64

// Refused returns how many moves the table has refused in this process
// (see [Request]). A core with no bug refuses none; the tests of the
// shells fail if one did.
func Refused() int64 { return refused.Load() }

// advance moves q to phase to if the table allows it in q's mode, and
// reports whether it did. A refused move is a bug of the core: it is
// counted (see Refused) and q stays where it was.
func (q *Request) advance(to Phase) bool {
	from := q.phase
	if int(from) >= len(moves) || moves[from][to]&(1<<q.cfg.Mode) == 0 {
		refused.Add(1)
		if q.cfg.Observe != nil {
			q.cfg.Observe(from, to, false)
		}
		return false
	}
	q.phase = to
	if q.cfg.Observe != nil {
		q.cfg.Observe(from, to, true)
	}
	return true
}
