package servercore

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/internal/fingerprint"
)

// ErrClaimLost and ErrStoreFull are idemserver's sentinels of the same
// names (idemserver re-exports these values), here so that the core can
// read a store's errors without importing idemserver.
var (
	ErrClaimLost = errors.New("idemserver: claim lost")
	ErrStoreFull = errors.New("idemserver: store full")
)

// Mode says what a shell can do with a handler's effects.
type Mode uint8

// The modes.
const (
	// Streamed: idemserver.Middleware over a Store. The handler's effects
	// happen as it runs and cannot be undone; its response streams to the
	// client as it is written.
	Streamed Mode = iota + 1
	// Transactional: contrib/postgres's TxMiddleware. The handler's
	// effects are in a transaction that commits with the record or rolls
	// back; its response is buffered until then.
	Transactional
)

// Config is one middleware's rules. Set its fields before the first
// request; it is read-only afterwards, and safe for concurrent use then.
type Config struct {
	Mode Mode

	// ShouldStore reports whether a response with the given status is kept
	// for replays; otherwise the key is released. Nil means
	// [DefaultShouldStore].
	ShouldStore func(status int) bool

	// DefaultFingerprint says that the request fingerprints are
	// fingerprint.Current's, so that the fingerprints of earlier versions,
	// which records stored by earlier releases hold, are accepted too. A
	// middleware with a fingerprint of its own leaves it false.
	DefaultFingerprint bool

	// SerializationRetries is how many times a Transactional request
	// rolled back by a serialization failure or a deadlock runs again.
	SerializationRetries int

	// Observe, when set, is told of every move of every request, allowed
	// (ok) or refused by the table: for tests and the simulator.
	Observe func(from, to Phase, ok bool)
}

// DefaultShouldStore is idemserver's default storage rule: 2xx, 3xx and
// the 4xx a retry of the same request would get again. Not stored: 5xx,
// which the next attempt may not repeat, and 401, 403, 408, 409, 423, 425
// and 429, which depend on credentials, permissions, load or other
// requests rather than on the request itself.
func DefaultShouldStore(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout,
		http.StatusConflict, http.StatusLocked, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

func (c *Config) shouldStore(status int) bool {
	if c.ShouldStore == nil {
		return DefaultShouldStore(status)
	}
	return c.ShouldStore(status)
}

// keepsOrPanics is shouldStore for rule 2, which runs while a handler's
// panic unwinds: a ShouldStore that panics there too is taken as keeping
// the status (its key then stays completed, not replayable), since a
// second panic would leave the claim with nobody to finish it, and a
// retry would run the handler again once its lock timed out. The
// handler's own panic goes on to net/http.
func (c *Config) keepsOrPanics(status int) (keeps bool) {
	defer func() {
		if recover() != nil {
			keeps = true
		}
	}()
	return c.shouldStore(status)
}

// Request is one keyed request's way through the core. Its zero value is
// not usable: start one with [Config.Start]. It is not safe for
// concurrent use: the request's goroutine drives it.
type Request struct {
	cfg   *Config
	phase Phase
	plan  Plan
	runs  int // runs begun, for SerializationRetries

	// Streamed completion and release attempts:
	deadline  time.Time // the claim's lock runs out (as the renewals know it)
	retry     time.Duration
	ambiguous bool // an attempt failed without saying whether it took effect
	pinned    bool // the claim is kept for the TTL
	pinTried  bool
}

// Start returns a request in phase Claiming.
func (c *Config) Start() Request {
	return Request{cfg: c}
}

// Phase returns where q stands.
func (q *Request) Phase() Phase { return q.phase }

// State is what a claim found under the key.
type State uint8

// The states of [Found].
const (
	// Free: no live record held the key, and the claim took it: the
	// handler runs.
	Free State = iota + 1
	// Held: another request's claim holds the key.
	Held
	// Completed: a record is kept under the key.
	Completed
)

// Found is what a claim found: a store's ClaimResult, or what
// [TxFound] makes of a transactional claim.
type Found struct {
	State       State
	Fingerprint string // the first request's; see NoFingerprint
	Record      []byte // Completed: the record
	// NoFingerprint: the holder's fingerprint is not known (a
	// TxMiddleware request whose record is not written yet), so it
	// cannot be compared: the answer is 409, never 422.
	NoFingerprint bool
	// Token is the claim token of the request that wrote the row found
	// (a transactional row's: [Row].Token), "" when not known (a
	// store's claim, which tells its own token itself).
	Token string
}

// Row is a transactional claim's look at the key's row: what
// TxMiddleware's lookup statement read, in a snapshot taken after it
// tried the key's lock.
type Row struct {
	Exists      bool   // a live row holds the key
	Completed   bool   // its record is written
	Token       string // the claim token of the request that wrote it (the key table's token column)
	Fingerprint string
	Record      []byte
}

// TxFound makes a transactional claim's evidence into what the claim
// found: locked, whether the key's advisory lock was taken; claimed,
// whether the claim row was written (which takes the lock first); row,
// the key's live row as the lookup after read it.
//
// A completed row is the key's answer whatever the lock says: the lock
// may be held by a duplicate reading the same row, and a request that
// answered 409 for it would make many retries of a completed key get 409
// instead of the replay (issue 30, §2.5). A row in progress (a Store's
// claim, or the marker a TxMiddleware handler committed with its own
// COMMIT) holds the key. A lock held with no row is a TxMiddleware
// request running, whose fingerprint is not known until it commits.
func TxFound(locked, claimed bool, row Row) (Found, error) {
	switch {
	case claimed && locked:
		return Found{State: Free}, nil
	case claimed:
		return Found{}, errors.New("the claim row was written without the key's lock")
	case row.Exists && row.Completed:
		return Found{State: Completed, Fingerprint: row.Fingerprint, Record: row.Record, Token: row.Token}, nil
	case row.Exists:
		return Found{State: Held, Fingerprint: row.Fingerprint, Token: row.Token}, nil
	case !locked:
		return Found{State: Held, NoFingerprint: true}, nil
	}
	// The lock was taken and the key is free, yet the claim row was not
	// written: nothing is known. Running the handler could run it twice.
	return Found{}, errors.New("the key is free but its claim row was not written")
}

// RowFound makes a look at the key's row, taken without its lock (after a
// rollback, or before the transaction begins under SERIALIZABLE), into
// what a new claim of the key would find, short of taking it.
func RowFound(row Row) Found {
	switch {
	case !row.Exists:
		return Found{State: Free}
	case row.Completed:
		return Found{State: Completed, Fingerprint: row.Fingerprint, Record: row.Record, Token: row.Token}
	}
	return Found{State: Held, Fingerprint: row.Fingerprint, Token: row.Token}
}

// Claim is the evidence of a claim.
type Claim struct {
	// Err is the store's error: nothing is known of the key. An error
	// wrapping ErrStoreFull is the store's refusal for lack of room.
	Err   error
	Found Found
	// Fingerprint is this request's fingerprint; Request and Body are
	// the request, for the earlier versions of the default fingerprint.
	Fingerprint string
	// Token is this request's claim token (Transactional: the token its
	// claim row was written with), for [Request.Rechecked] to tell the
	// request's own claim row from another request's; "" when the
	// shell does not say.
	Token   string
	Request *http.Request
	Body    []byte
}

// Answer says what the client gets.
type Answer uint8

// The answers.
const (
	AnswerRun           Answer = iota + 1 // the key is claimed: run the handler
	AnswerInProgress                      // 409 with Retry-After
	AnswerMismatch                        // 422: the key was used with another request
	AnswerReplay                          // the stored response, marked as a replay
	AnswerNotReplayable                   // 410: it ran, and its response was not kept
	AnswerStoreFull                       // 503 with Retry-After: the store refused for lack of room
	AnswerStoreFailed                     // 503 with Retry-After: the store cannot say
	AnswerCorrupt                         // 503 with Retry-After: the record is not one the core wrote

	// The answers of a Transactional request after its handler ran:
	AnswerSend          // the handler's buffered response
	AnswerRolledBack    // 500: nothing committed, the key is free
	AnswerTooLarge      // 500: the response is too large to store: rolled back, the key free
	AnswerTxEnded       // 500: the handler ended the transaction; the key kept, not replayable
	AnswerSerialization // 503: rolled back by a serialization failure; the key free
	AnswerUnknown       // 503: the commit's outcome is unknown
	AnswerNone          // Streamed: the handler's response went out as it wrote it
)

// Verdict is the core's answer to a claim (or to a look at the key after
// a rollback).
type Verdict struct {
	Answer Answer
	// Status is the replayed status, or the status a 410's request
	// answered (0 if unknown).
	Status int
	// Body is the replayed body, a slice of the record.
	Body []byte
	// Err is why: the store's error, or the record's.
	Err error
}

// Claimed decides on a claim from its evidence: run the handler (q moves
// to Running) or answer without running it (Answered). For a replay, the
// stored header fields are set in into, which the shell sends.
func (q *Request) Claimed(c Claim, into http.Header) Verdict {
	v := q.cfg.judge(c, into)
	if v.Answer == AnswerRun {
		q.runs++
		q.advance(Running)
	} else {
		q.advance(Answered)
	}
	return v
}

// judge is the claim's decision, shared by Claimed and Rechecked.
func (c *Config) judge(ev Claim, into http.Header) Verdict {
	f := ev.Found
	switch {
	case errors.Is(ev.Err, ErrStoreFull):
		return Verdict{Answer: AnswerStoreFull, Err: ev.Err}
	case ev.Err != nil:
		return Verdict{Answer: AnswerStoreFailed, Err: ev.Err}
	case f.State < Free || f.State > Completed:
		// Running the handler on a result we cannot trust could run it twice.
		return Verdict{Answer: AnswerStoreFailed, Err: fmt.Errorf("idemserver: store returned an invalid claim state %d", f.State)}
	case f.State == Free:
		return Verdict{Answer: AnswerRun}
	case !f.NoFingerprint && !c.sameRequest(f.Fingerprint, ev):
		return Verdict{Answer: AnswerMismatch}
	case f.State == Held:
		return Verdict{Answer: AnswerInProgress}
	}
	status, body, err := ParseRecord(f.Record, into)
	switch {
	case errors.Is(err, ErrNotReplayable):
		return Verdict{Answer: AnswerNotReplayable, Status: status}
	case err != nil:
		return Verdict{Answer: AnswerCorrupt, Err: err}
	}
	return Verdict{Answer: AnswerReplay, Status: status, Body: body}
}

// sameRequest reports whether stored, the fingerprint a record was
// stored with, is this request's: its fingerprint, or, with the default
// fingerprint, the one an earlier version gave it (a record stored before
// an upgrade). The earlier versions are computed only when the
// fingerprints differ.
func (c *Config) sameRequest(stored string, ev Claim) bool {
	if stored == ev.Fingerprint {
		return true
	}
	return c.DefaultFingerprint && ev.Request != nil && fingerprint.Older(ev.Request, ev.Body, stored)
}
