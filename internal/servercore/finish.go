package servercore

import (
	"errors"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
)

// TxState is a Transactional handler's transaction as the shell finds it
// when the handler returns, without asking the database.
type TxState uint8

// The states of [Handler].Tx.
const (
	// TxOpen: the claim's transaction is open, as far as the connection
	// shows (a transaction the handler began after ending the claim's is
	// found by the statement that stores the record, or by the rollback).
	TxOpen TxState = iota
	// TxAborted: a statement failed; the transaction can only roll back.
	TxAborted
	// TxIdle: the connection is outside any transaction: the handler
	// ended the claim's (a COMMIT, COMMIT AND CHAIN then another end, a
	// ROLLBACK), so what it committed is unknown.
	TxIdle
	// TxBroken: the connection is gone, and the server rolled back what
	// was open.
	TxBroken
)

// Handler is the evidence of a run, once the handler has returned (or
// panicked).
type Handler struct {
	Panicked bool
	// Err is a Transactional handler's error: roll back.
	Err error
	// Serialization: Err is a serialization failure or a deadlock
	// (SQLSTATE 40001, 40P01): running the request again may succeed.
	Serialization bool
	// Wrote: the handler wrote a status or a body.
	Wrote bool
	// Status is the final status the handler wrote, 200 for one that wrote
	// only a body or nothing, 0 after a hijack that wrote none.
	Status int
	// Hijacked: the handler took the connection, or answered 101
	// Switching Protocols: what it sent cannot be replayed.
	Hijacked bool
	// Overflow: the response is larger than the stored limit.
	Overflow bool
	// ClientGone: the request's context was done when the handler
	// returned (the client left, a deadline passed).
	ClientGone bool
	// Unjudged: the handler returned, but the server author's ShouldStore
	// panicked on its status (the panic goes on to net/http): whether to
	// keep the response is unknown.
	Unjudged bool
	// Tx is a Transactional handler's transaction.
	Tx TxState

	// LockUntil is when the claim's lock runs out, as the Streamed shell's
	// renewals know it: Complete and Release are retried until then.
	LockUntil time.Time
	// Retry is the wait after a fast failure of Complete or Release
	// (Streamed): the next attempt starts Retry after the failed one
	// began, or at once after a slow one.
	Retry time.Duration
}

// Action is what the shell does next.
type Action uint8

// The actions.
const (
	// Keep: store the handler's response (Streamed: Complete with the
	// record; Transactional: the record with COMMIT).
	Keep Action = iota + 1
	// KeepUnreplayable: keep the key completed, not replayable:
	// Complete with Unreplayable(Plan.Status) (Streamed), or the marker
	// written after the rollback (Transactional, from Marking).
	KeepUnreplayable
	// Release: give the claim up (Release, or the rollback).
	Release
	// Pin: Streamed: Renew the claim for the TTL, so that it outlives a
	// Complete that keeps failing, then report with Pinned and go on.
	Pin
	// Wait: Streamed: try the same call again at Step.At.
	Wait
	// Recheck: Transactional: look the key up afresh, after the rollback,
	// and report with Rechecked.
	Recheck
	// Done: the request has reached its end (Step.Phase).
	Done
)

// Reason says why a claim was released, for the hooks. The values are
// idemserver's ReleaseReason values.
type Reason string

// The reasons.
const (
	ReasonServerError = "server_error"
	ReasonNotStored   = "not_stored"
	ReasonNotStorable = "not_storable"
	ReasonCanceled    = "canceled"
	ReasonPanic       = "panic"
	ReasonRolledBack  = "rolled_back"
	ReasonClaimLost   = "claim_lost"
)

// Plan is what to do once the handler has returned.
type Plan struct {
	Do     Action // Keep, KeepUnreplayable or Release
	Status int    // the handler's status (0 if none): the hooks', the marker's
	Reason Reason // Release: why
	// Answer is what a Transactional client gets once Do has succeeded;
	// AnswerNone for Streamed, whose response went out as it was
	// written.
	Answer Answer
	// recheck: after the rollback, look the key up afresh (see Rechecked).
	recheck bool
	// serialization: the handler's error was a serialization failure.
	serialization bool
}

// Returned decides what becomes of a run from the evidence of its end:
// keep its response, keep its key as not replayable, or release the
// claim. q moves to Completing, Releasing or Marking.
//
// The rules, in order, each the one place where it is decided:
//
//  1. A Transactional handler that ended its transaction itself may have
//     committed its effect apart from its record: keep the key completed,
//     not replayable (410), and answer 500 (Marking).
//  2. A handler that panicked: release (the panic continues). A
//     Transactional rollback that then finds the transaction ended keeps
//     the key instead (rule 1). A Streamed handler that had written a
//     status ShouldStore keeps (or hijacked the connection) before it
//     panicked (a deferred audit log that fails after the answer) ran:
//     keep its key completed, not replayable, as after a hijack;
//     released, a retry would run it again. A ShouldStore that panics
//     there too counts as keeping (keepsOrPanics).
//  3. A handler that returned without writing anything while its
//     request's context was done gave up (its client left, a deadline
//     passed): release, in every mode, never a stored empty 200 replayed
//     for the TTL. A handler that completed its effect must write its
//     status before returning.
//  4. A Transactional handler's error: roll back, release, and answer
//     500 (or as a duplicate, should the key have been taken meanwhile).
//  5. A status no response has (outside 100-999): release.
//  6. A response that cannot be kept as it was sent (a hijacked
//     connection, 101 Switching Protocols; Transactional: a body over the
//     limit, which the buffer dropped): if its effects can be undone
//     (Transactional), roll back and release, answering 500; if not
//     (Streamed), keep the key completed, not replayable, since it ran.
//  7. A status ShouldStore refuses (a 5xx, by default): release; a
//     Transactional response is sent after the rollback. A ShouldStore
//     that panicked (Unjudged): a Transactional run rolls back and
//     releases, as after a panic; a Streamed one ran and its response
//     went out, so its key is kept completed, not replayable.
//  8. A Transactional statement that failed (the transaction aborted):
//     nothing can commit; release, answering 500.
//  9. Streamed, a body over the limit: it reached the client whole; keep
//     the key completed, not replayable.
//  10. Otherwise keep the response.
//
// tx is the transaction's state, Transactional only.
func (q *Request) Returned(ev Handler) Plan {
	streamed := q.cfg.Mode == Streamed
	q.deadline, q.retry = ev.LockUntil, ev.Retry
	p := Plan{Status: ev.Status, Answer: AnswerNone}
	switch {
	case !streamed && ev.Tx == TxIdle:
		p = Plan{Do: KeepUnreplayable, Status: ev.Status, Answer: AnswerTxEnded}
	case ev.Panicked && streamed && (ev.Hijacked || ev.Wrote && ev.Status >= 100 && ev.Status <= 999 && q.cfg.keepsOrPanics(ev.Status)):
		// It answered (or took the connection) before it panicked: its
		// effect ran, and its answer may have reached the client.
		// Released, a retry would run it again.
		p.Do = KeepUnreplayable
	case ev.Panicked:
		p.Do, p.Reason, p.Status = Release, ReasonPanic, 0
		if !streamed {
			p.Answer = AnswerRolledBack
		}
	case ev.ClientGone && !ev.Wrote && !ev.Hijacked && !(plant.GiveUpStored && !streamed):
		p.Do, p.Reason, p.Status = Release, ReasonCanceled, 0
		if !streamed {
			p.Answer = AnswerRolledBack
		}
	case !streamed && ev.Err != nil:
		p.Do, p.Reason, p.Answer, p.recheck = Release, ReasonRolledBack, AnswerRolledBack, true
		p.serialization = ev.Serialization
	case !ev.Hijacked && (ev.Status < 100 || ev.Status > 999):
		p.Do, p.Reason = Release, ReasonNotStorable
		if !streamed {
			p.Answer = AnswerRolledBack
		}
	case !streamed && (ev.Hijacked || ev.Overflow):
		p.Do, p.Reason, p.Answer = Release, ReasonNotStorable, AnswerRolledBack
		if ev.Overflow {
			p.Answer = AnswerTooLarge
		}
	case ev.Hijacked:
		p.Do = KeepUnreplayable
	case ev.Unjudged && streamed:
		p.Do = KeepUnreplayable
	case ev.Unjudged:
		p.Do, p.Reason, p.Answer = Release, ReasonPanic, AnswerRolledBack
	case !q.cfg.shouldStore(ev.Status):
		p.Do, p.Reason = Release, ReasonNotStored
		if ev.Status >= 500 {
			p.Reason = ReasonServerError
		}
		if !streamed {
			p.Answer = AnswerSend
		}
	case !streamed && ev.Tx != TxOpen:
		// Aborted, or the connection broke: nothing can commit.
		p.Do, p.Reason, p.Answer, p.recheck = Release, ReasonRolledBack, AnswerRolledBack, true
	case ev.Overflow:
		p.Do = KeepUnreplayable
	default:
		p.Do = Keep
		if !streamed {
			p.Answer = AnswerSend
		}
	}
	q.plan = p
	switch {
	case p.Do == Release:
		q.advance(Releasing)
	case p.Do == KeepUnreplayable && !streamed:
		q.advance(Marking)
	default:
		q.advance(Completing)
	}
	return p
}

// Step is what the shell does after a store call.
type Step struct {
	Do Action // Wait, Pin, Recheck, KeepUnreplayable (Transactional: write the marker), Done
	// At is when to try again (Wait).
	At time.Time
	// Phase is where the request ended (Done).
	Phase Phase
	// Answer is what a Transactional client gets (Done).
	Answer Answer
	// Reason is why the key was released (Done in Released).
	Reason Reason
	// Status is the handler's status, as the plan has it (0 after a
	// panic): the marker's (KeepUnreplayable) and the hooks'.
	Status int
}

func (q *Request) done(to Phase, a Answer) Step {
	q.advance(to)
	return Step{Do: Done, Phase: to, Answer: a, Reason: q.plan.Reason, Status: q.plan.Status}
}

// Completed reports a Streamed Complete (of the record of Keep or
// KeepUnreplayable) that began at began and answered err at now, and
// says what next. Complete is tried until it succeeds for as long as the
// claim's lock is live, as renewals are: a store that refuses one call
// (a blip, a Redis past its memory) does not leave the key to expire
// and run again. After the first failure the claim is pinned for the
// TTL (Pin), so that a Complete that keeps failing leaves the key
// claimed, answering 409, rather than free: the handler ran.
func (q *Request) Completed(err error, began, now time.Time) Step {
	switch {
	case err == nil:
		return q.done(Stored, AnswerNone)
	case errors.Is(err, ErrClaimLost):
		// Gone: its lock ran out, or an earlier attempt that seemed to
		// fail stored the record after all. Nothing more to do.
		if q.ambiguous {
			return q.done(Unsettled, AnswerNone)
		}
		return q.done(Lost, AnswerNone)
	}
	if plant.CompleteOnce {
		return q.done(Unsettled, AnswerNone)
	}
	q.ambiguous = true
	if !q.pinTried {
		q.pinTried = true
		q.advance(Completing)
		return Step{Do: Pin}
	}
	return q.again(began, now, Completing)
}

// Pinned reports the Pin's outcome and says what next: the Complete is
// tried again.
func (q *Request) Pinned(err error, began, now time.Time) Step {
	switch {
	case err == nil:
		q.pinned = true
	case errors.Is(err, ErrClaimLost):
		// The claim is gone, or the record was stored after all.
		return q.done(Unsettled, AnswerNone)
	}
	return q.again(began, now, Completing)
}

// again schedules the next attempt of a call that failed, begun at
// began: at once after a slow failure, Retry after began after a fast
// one, and never past the lock's end: then the request is done, Pinned
// if the claim is kept for the TTL, Unsettled otherwise.
func (q *Request) again(began, now time.Time, phase Phase) Step {
	at := began.Add(q.retry)
	if at.Before(now) {
		at = now
	}
	if !at.Before(q.deadline) {
		if q.pinned {
			return q.done(Pinned, AnswerNone)
		}
		return q.done(Unsettled, AnswerNone)
	}
	q.advance(phase)
	return Step{Do: Wait, At: at}
}

// ReleaseDone reports a Streamed Release that began at began and
// answered err at now. A Release that fails is tried again while the
// claim's lock is live, so that the key is free as soon as it may be;
// past that, the lock frees it.
func (q *Request) ReleaseDone(err error, began, now time.Time) Step {
	switch {
	case err == nil:
		return q.done(Released, AnswerNone)
	case errors.Is(err, ErrClaimLost):
		if q.ambiguous {
			return q.done(Released, AnswerNone) // an earlier attempt took effect after all
		}
		return q.done(Lost, AnswerNone)
	}
	q.ambiguous = true
	return q.again(began, now, Releasing)
}

// Commit is the evidence of a Transactional commit (the record's store
// and COMMIT).
type Commit uint8

// The outcomes of a commit.
const (
	CommitOK Commit = iota + 1
	// CommitEnded: the statement that stores the record found the
	// transaction not the claim's: the handler ended it and began another.
	CommitEnded
	// CommitClaimLost: the claim row was not the request's to write.
	CommitClaimLost
	// CommitRefused: the server refused the store or the COMMIT: the
	// transaction rolled back, nothing committed.
	CommitRefused
	// CommitSerialization: refused by a serialization failure or a
	// deadlock: rolled back, nothing committed, and running it again may
	// succeed.
	CommitSerialization
	// CommitUnknown: no answer (the connection was lost): the outcome is
	// unknown.
	CommitUnknown
)

// Committed reports a Transactional commit's outcome and says what next.
func (q *Request) Committed(c Commit) Step {
	switch c {
	case CommitOK:
		return q.done(Stored, AnswerSend)
	case CommitEnded:
		q.plan = Plan{Do: KeepUnreplayable, Status: q.plan.Status, Answer: AnswerTxEnded}
		q.advance(Marking)
		return Step{Do: KeepUnreplayable, Status: q.plan.Status}
	case CommitUnknown:
		// The record rides the same commit as the writes: a retry finds
		// both or neither, and meanwhile the lock (or the row) holds the
		// key.
		return q.done(Unsettled, AnswerUnknown)
	case CommitClaimLost:
		q.plan.Reason, q.plan.Answer = ReasonClaimLost, AnswerInProgress
	case CommitSerialization:
		q.plan.Reason, q.plan.Answer, q.plan.serialization = ReasonRolledBack, AnswerRolledBack, true
	default:
		q.plan.Reason, q.plan.Answer = ReasonRolledBack, AnswerRolledBack
	}
	q.plan.Do, q.plan.recheck = Release, true
	q.advance(Releasing)
	return Step{Do: Recheck}
}

// RolledBack reports a Transactional rollback (Release) and whether it
// found that the handler had ended the claim's transaction itself; it
// says what next.
func (q *Request) RolledBack(ended bool) Step {
	if ended {
		return q.endedItself()
	}
	if q.plan.recheck {
		q.advance(Releasing)
		return Step{Do: Recheck}
	}
	return q.done(Released, q.plan.Answer)
}

// endedItself keeps the key of a run whose handler ended the claim's
// transaction itself (rule 1 of Returned, found late): completed, not
// replayable, answering 500. A panic's status is unknown.
func (q *Request) endedItself() Step {
	status := q.plan.Status
	if q.plan.Reason == ReasonPanic {
		status = 0
	}
	q.plan = Plan{Do: KeepUnreplayable, Status: status, Answer: AnswerTxEnded}
	q.advance(Marking)
	return Step{Do: KeepUnreplayable, Status: status}
}

// Rechecked reports the fresh look at the key after a rollback (what a
// new claim of it would find, short of taking it) and decides the
// answer: as a duplicate would be answered if the key was taken meanwhile
// (under REPEATABLE READ or SERIALIZABLE, a duplicate that took the lock
// as the first run committed did not see that run's row, and its own
// writes then failed), with a replay's header fields set in into; for a
// serialization failure, run again while SerializationRetries allow
// (Again), else 503; otherwise the plan's answer. A failed look (c.Err)
// answers nothing: the rest stands.
//
// A row in progress with the request's own token (c.Found.Token ==
// c.Token) is no duplicate's: it is the request's own claim row, written
// in the transaction that just rolled back, so only the handler's own
// COMMIT (COMMIT AND CHAIN, then a store the database refused, or a
// statement that failed) can have committed it, and the handler's effect
// with it. That is a handler that ended its transaction (rule 1 of
// Returned): keep the key completed, not replayable (KeepUnreplayable,
// then Marked), and answer 500; never 409, which a client that minted
// the key would take for another request's (the simulator's seed 9714).
func (q *Request) Rechecked(c Claim, into http.Header) (Step, Verdict) {
	if c.Err == nil && c.Found.State == Held && c.Token != "" && c.Found.Token == c.Token {
		return q.endedItself(), Verdict{}
	}
	if c.Err == nil && (c.Found.State == Held || c.Found.State == Completed) {
		v := q.cfg.judge(c, into)
		q.advance(Answered)
		return Step{Do: Done, Phase: Answered, Answer: v.Answer, Reason: q.plan.Reason, Status: q.plan.Status}, v
	}
	if q.plan.serialization {
		if q.runs <= q.cfg.SerializationRetries {
			q.advance(Again)
			return Step{Do: Done, Phase: Again}, Verdict{}
		}
		q.plan.Answer = AnswerSerialization
	}
	return q.done(Released, q.plan.Answer), Verdict{}
}

// Restart begins the claim of a request that is Again.
func (q *Request) Restart() {
	q.advance(Claiming)
}

// Marked reports the write of the not-replayable marker after the
// handler ended its transaction (Transactional): the key is kept, or, if
// the write failed, held by whatever the handler committed (its claim
// row answers 409 for the TTL) or free (nothing committed).
func (q *Request) Marked(err error) Step {
	if err != nil {
		return q.done(Unsettled, AnswerTxEnded)
	}
	return q.done(Stored, AnswerTxEnded)
}
