package idemhttp

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// State is where a journaled operation stands.
type State string

// The states of a journal [Entry].
const (
	// StatePending: the key was recorded and the operation may or may not
	// have run on the server. [Client.Resume] resends it with the same key.
	StatePending State = "pending"
	// StateDone: a definite outcome (2xx, or a 4xx that a retry would not
	// change) was received. Kept for [Policy.Retention] so that rerunning
	// the operation sends nothing, then pruned. Final: no later Finish
	// changes it.
	//
	// A done entry whose LastStatus is a server error (5xx) got a failure
	// the server stored and replays to every retry with the key (Stripe
	// stores a 500 that way): no resend can finish the operation, and it
	// may have run in part. It needs reconciling with the server's own
	// records; `idemctl pending` lists it as "reconcile" and says how.
	StateDone State = "done"
	// StateAbandoned: the entry outlived the server's key retention while
	// pending, so it was not resent ([ErrKeyExpired]), or its call could
	// not withdraw it. A person or a reconciliation step must decide what
	// happened. Final, like done.
	StateAbandoned State = "abandoned"
)

// Entry is one journaled operation: everything needed to resend it with
// the same key and a byte-identical body after a crash, and nothing secret.
type Entry struct {
	Operation   string      // caller's operation id (WithOperation), "" if none
	Key         string      // idempotency key; unique within a journal
	Method      string      // HTTP method
	URL         string      // request URL, with any password removed
	Header      http.Header // request headers minus credentials and secret headers
	Body        []byte      // request body; nil when the journal does not store bodies
	Fingerprint string      // hex SHA-256 of method, URL and body
	Created     time.Time   // when the key was first recorded
	Updated     time.Time   // when the entry last changed
	Attempts    int         // attempts made so far, across processes
	LastStatus  int         // status of the last response, 0 if none
	State       State       // pending, done or abandoned
	Result      *Result     // with State done: the final response's copy, if kept (Policy.KeepResults); nil otherwise

	// NotBefore, with State pending, is the earliest time the entry may be
	// sent again, by the journal's clock: the time the server asked the
	// client to come back at (Retry-After) when a call parked the
	// operation ([ErrParked]). Zero for none.
	NotBefore time.Time
}

// Result is a bounded copy of an operation's final response, which a
// journal keeps with the done entry when [Policy.KeepResults] allows, so
// that a rerun of the operation gets its result back (as a replay, sending
// nothing) instead of a [*DoneError]: a charge's id survives a crash
// between the server's answer and the caller saving it.
//
// The body is kept as the caller read it: decoded when net/http decoded
// it (the caller set no Accept-Encoding), encoded and with its
// Content-Encoding when the caller asked for an encoding itself. The
// headers are those a caller reads, never Set-Cookie, with the URLs
// they hold redacted ([Outcome.Sanitized]): a rerun of an operation
// whose response held a signed URL gets it back as REDACTED.
type Result struct {
	Status int         // the response's status code
	Header http.Header // the headers a caller reads (Content-Type, Content-Encoding, Location, request ids...), never Set-Cookie
	Body   []byte      // the whole body, as the caller read it (a body larger than the limit is not kept at all)
}

// Outcome is what [Journal.Finish] records at the end of a call.
type Outcome struct {
	State    State     // the entry's new state
	Status   int       // status of the last response, 0 if none; replaces Entry.LastStatus
	Attempts int       // attempts this call made; added to Entry.Attempts
	At       time.Time // when the call ended; zero for a journal with its own clock, which stamps it
	Result   *Result   // with State done: the response to keep with the entry, nil for none

	// NotBefore, with State pending, is the entry's new Entry.NotBefore:
	// the earliest time it may be sent again, by the journal's clock (the
	// server's Retry-After, when the call parked it); zero clears it.
	NotBefore time.Time
}

// Journal records pending idempotency keys durably, so that a process that
// dies mid-request resends the operation with the same key after a restart
// instead of minting a new one and running it twice.
//
// An entry's life: Begin writes it pending before the first byte of its
// request leaves; Finish records a definite outcome (done) or an
// ambiguous one (pending again, for Resume); Delete withdraws an entry
// whose call provably sent nothing; Prune forgets done entries once the
// server has forgotten their keys too. Done and abandoned are final: a
// write that would change a final entry, or an entry another process
// holds (a journal shared by a fleet leases entries to its workers), is
// refused with an error wrapping [ErrFenced] and changes nothing, so that
// a stale writer can never revive, overwrite or remove what another has
// finished. docs/lifecycle.md has the whole state machine.
//
// Implementations must be safe for concurrent use, and apply
// [Entry.Sanitized] to every entry they store and [Outcome.Sanitized] to
// every outcome they record. Beyond the interface, a
// Client uses the optional methods a journal has (see package journaltest,
// which asserts them): HighWater (the latest time ever recorded, to see a
// clock set back), Now (a clock of its own, which ages its entries: a
// fleet's shared database's), ClockDoubt (entries of unknown age), Retain
// (the client's Policy.Retention, for a journal that prunes by itself),
// PendingCount (for Client.Stats) and ClaimPending (a journal a fleet
// shares).
//
// # Wrappers
//
// A journal that wraps another (a caller's metrics or tracing decorator)
// should reveal it with a method
//
//	Unwrap() Journal
//
// as errors.Unwrap and http.ResponseController do, and return the same
// journal for the wrapper's life. A Client resolves the chain once, when
// it is first used (a bounded walk: a cycle, or an Unwrap
// that panics, ends it), and looks there for the optional methods the
// wrapper does not have itself (a wrapper's own method wins), and for the
// journal's identity: every Client of a process that reaches one journal,
// through whatever wrappers, then shares the rule "one sender per
// operation and per key at a time" (docs/lifecycle.md).
//
// The project's own journals (filejournal's, contrib/postgres's, the
// Client's in-memory one) declare who may send under their keys: one
// process (a file journal is locked against a second opener) or a fleet
// (whose writes are fenced by lease). Any other journal, a caller's own or
// one behind a wrapper without Unwrap, is treated as shared with senders
// the client cannot see, and the client fails closed, at a cost: a bare
// 409 (one whose body says nothing) to the first attempt under a key
// minted for the call is taken for another sender's request in progress
// and retried, waited out for at most Policy.InProgressPatience, rather
// than returned at once as the application's own conflict; and a call
// that provably sent nothing keeps its entry pending (for Resume, or a
// rerun of the operation under its key) rather than withdrawing it, and
// its error does not match [ErrNotSent]. A wrapper that embeds one of
// those journals' concrete types (struct{ *filejournal.Journal }) keeps
// the declaration, and the identity, of the journal it embeds, unless it
// also has Unwrap: only the journal the chain ends at declares, since it
// is the one that holds the entries.
//
// [github.com/idemkit/idemhttp/filejournal.Journal] is the embedded
// default; the journaltest package holds the conformance suite every
// implementation must pass.
type Journal interface {
	// Begin records e as pending and makes it durable before returning,
	// unless the journal already holds an entry with e.Operation (when not
	// empty) or, failing that, with e.Key. Then Begin writes nothing and
	// returns that entry (the operation's, when both exist). The check and
	// the write are one atomic step, so concurrent calls for one operation
	// agree on a single key. It stores what e.Sanitized returns (with the
	// journal's own secret header names, if it has any), and fails with
	// its error.
	Begin(ctx context.Context, e *Entry) (existing *Entry, err error)

	// Finish records the outcome of the call that sent key's operation,
	// as o.Sanitized returns it (and fails with its error): it adds
	// o.Attempts to the entry's, and sets its state, last status, Updated
	// time, NotBefore and, for done, its Result. It returns an error
	// wrapping [ErrNotFound] for an unknown key. An entry already done or
	// abandoned keeps its state: a Finish with the same state only adds
	// its attempts; one with another state changes nothing and returns an
	// error wrapping [ErrFenced], as does a Finish of an entry that
	// another process's live lease holds.
	//
	// Finish may return before the outcome is durable
	// (filejournal.Journal writes it behind, with the next group commit),
	// provided it becomes durable no later than any later Begin that
	// stores an entry. Losing it in a crash is safe: the entry is still
	// pending after the restart, and Resume resends it under the same key,
	// which the server answers from its stored response. What must never
	// be lost is a Begin.
	Finish(ctx context.Context, key string, o Outcome) error

	// Get returns the entry for key, Result included, or an error
	// wrapping [ErrNotFound].
	Get(ctx context.Context, key string) (*Entry, error)

	// Lookup returns the entry for operation (an id given to
	// [WithOperation]), or an error wrapping [ErrNotFound]. It is meant
	// for skipping operations already done, many at a time: an
	// implementation may leave out the request (Method, URL, Header, Body
	// and Fingerprint), the Result and the NotBefore to avoid reading
	// them; Get(ctx, e.Key) returns them.
	Lookup(ctx context.Context, operation string) (*Entry, error)

	// Pending returns the entries in state pending, oldest first, parked
	// ones (with a NotBefore) included.
	Pending(ctx context.Context) ([]*Entry, error)

	// Prune deletes the done entries last updated before cutoff and returns
	// how many it deleted. Pending and abandoned entries are never pruned:
	// they describe operations whose outcome nobody knows yet.
	Prune(ctx context.Context, cutoff time.Time) (int, error)

	// Delete withdraws the pending entry for key, or returns an error
	// wrapping [ErrNotFound] for an unknown key, and one wrapping
	// [ErrFenced], removing nothing, for a final entry, done or abandoned
	// (only Prune forgets done ones, after the retention; an abandoned one
	// keeps its operation's key until a person resolves it), or for one
	// another process has taken since this one wrote it (a journal shared
	// by a fleet: its lease live or not, since that process may have sent
	// it; and one with an attempt recorded). A Client calls it only to withdraw an
	// entry its own call created and that provably never reached the
	// wire, so that Resume never sends a request its caller was told did
	// not go out. An abandoned entry is never withdrawn: another sender
	// may have sent it before it was abandoned, and removing it would let
	// a rerun of its operation begin afresh under a new key (issue 32's
	// bugFleetExpiredRerun). Removing an entry a person has resolved is an
	// operator's act, with the journal's own method for it
	// (filejournal.Journal.Forget, the PostgreSQL journal's Forget). Like
	// Begin, Delete is durable on return.
	Delete(ctx context.Context, key string) error
}

// clockJournal is implemented by a [Journal] that remembers the latest
// time it has ever recorded (an entry's Created or Updated time, an
// outcome's At), including the times of entries it has pruned or deleted
// since. A [Client] whose journal implements it judges the clock against
// that mark as well as against the entries still there: a clock more
// than [ClockTolerance] below the mark was set back, and every pending
// entry's age is then in doubt, so [Client.Resume] resends none of them
// and [Client.Do] does not reuse one ([ErrClockJump]). Without it, the
// client sees the jump only while the entries newer than the clock are
// still in the journal: once they are pruned, an entry really older than
// the server's key retention may look younger and be resent under a key
// the server has forgotten. [github.com/idemkit/idemhttp/filejournal.Journal] implements it.
type clockJournal interface {
	// HighWater returns the mark: the latest time recorded, never
	// lower than before, or the zero Time when the journal recorded
	// none.
	HighWater(ctx context.Context) (time.Time, error)
}

// memJournal is the Journal a Client uses when it has none and a call
// names an operation: keys live for the life of the Client, so an
// operation retried by the caller reuses its key and a changed body is
// refused locally. Done entries older than the retention are pruned as
// new ones arrive; pending ones past it are kept, abandoned (see
// forgetLocked).
type memJournal struct {
	retention time.Duration
	mu        sync.Mutex
	byKey     map[string]*Entry
	byOp      map[string]string
	inserts   int
}

func newMemJournal(retention time.Duration) *memJournal {
	return &memJournal{retention: retention, byKey: make(map[string]*Entry), byOp: make(map[string]string)}
}

var _ Journal = (*memJournal)(nil)

// memPruneEvery is how many inserts pass between prunes of a memJournal.
const memPruneEvery = 1024

func (m *memJournal) Begin(_ context.Context, e *Entry) (*Entry, error) {
	e, err := e.Sanitized()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Operation != "" {
		if k, ok := m.byOp[e.Operation]; ok {
			return cloneEntry(m.byKey[k]), nil
		}
	}
	if old, ok := m.byKey[e.Key]; ok {
		return cloneEntry(old), nil
	}
	m.inserts++
	if m.inserts%memPruneEvery == 0 {
		m.forgetLocked(e.Created.Add(-m.retention))
	}
	m.byKey[e.Key] = cloneEntry(e)
	if e.Operation != "" {
		m.byOp[e.Operation] = e.Key
	}
	return nil, nil
}

func (m *memJournal) Finish(_ context.Context, key string, o Outcome) error {
	o, err := o.Sanitized()
	if err != nil {
		return fmt.Errorf("finish %s: %w", key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return fmt.Errorf("finish %s: %w", key, ErrNotFound)
	}
	if e.State != StatePending {
		if e.State != o.State {
			return fmt.Errorf("finish %s: %w: the entry is %s", key, ErrFenced, e.State)
		}
		e.Attempts += o.Attempts
		return nil
	}
	e.State, e.LastStatus, e.Updated, e.NotBefore = o.State, o.Status, o.At, o.NotBefore
	e.Attempts += o.Attempts
	e.Result = cloneResult(o.Result) // Sanitized: nil but for done
	return nil
}

func (m *memJournal) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return fmt.Errorf("delete %s: %w", key, ErrNotFound)
	}
	if e.State != StatePending {
		return fmt.Errorf("delete %s: %w: the entry is %s", key, ErrFenced, e.State)
	}
	delete(m.byKey, key)
	if e.Operation != "" && m.byOp[e.Operation] == key {
		delete(m.byOp, e.Operation)
	}
	return nil
}

func (m *memJournal) Get(_ context.Context, key string) (*Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return cloneEntry(e), nil
}

func (m *memJournal) Lookup(_ context.Context, operation string) (*Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.byOp[operation]; ok {
		return cloneEntry(m.byKey[k]), nil
	}
	return nil, fmt.Errorf("lookup %s: %w", operation, ErrNotFound)
}

func (m *memJournal) Pending(context.Context) ([]*Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*Entry
	for _, e := range m.byKey {
		if e.State == StatePending {
			out = append(out, cloneEntry(e))
		}
	}
	slices.SortFunc(out, func(a, b *Entry) int { return a.Created.Compare(b.Created) })
	return out, nil
}

func (m *memJournal) Prune(_ context.Context, cutoff time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pruneLocked(cutoff), nil
}

// forgetLocked is the memory journal's own housekeeping, so that a
// long-lived Client stays bounded: done entries created before cutoff
// are dropped (as a journal prunes them after the retention), and
// pending or abandoned ones are kept, as a journal keeps them, but
// shrunk to what judge reads (no body, no headers) and marked
// abandoned: the server may have forgotten their keys, a rerun of their
// operation gets ErrKeyExpired, and nothing sends them again. Forgetting
// them instead would let a rerun begin afresh under a new key and run an
// operation that may have run already. What stays grows only with the
// operations whose outcome was never known: the ones a person must look
// at anyway.
func (m *memJournal) forgetLocked(cutoff time.Time) {
	for k, e := range m.byKey {
		if !e.Created.Before(cutoff) {
			continue
		}
		if e.State == StateDone {
			delete(m.byKey, k)
			if e.Operation != "" && m.byOp[e.Operation] == k {
				delete(m.byOp, e.Operation)
			}
			continue
		}
		e.State, e.Body, e.Header, e.Result = StateAbandoned, nil, nil, nil
	}
}

func (m *memJournal) pruneLocked(cutoff time.Time) int {
	n := 0
	for k, e := range m.byKey {
		if e.State == StateDone && e.Updated.Before(cutoff) {
			delete(m.byKey, k)
			if e.Operation != "" {
				delete(m.byOp, e.Operation)
			}
			n++
		}
	}
	return n
}

// cloneEntry copies e so callers cannot alias a journal's state.
func cloneEntry(e *Entry) *Entry {
	c := *e
	c.Header = e.Header.Clone()
	c.Body = bytes.Clone(e.Body)
	c.Result = cloneResult(e.Result)
	return &c
}

// cloneResult copies r, nil for nil.
func cloneResult(r *Result) *Result {
	if r == nil {
		return nil
	}
	return &Result{Status: r.Status, Header: r.Header.Clone(), Body: bytes.Clone(r.Body)}
}

// retainer is implemented by a [Journal] that prunes done entries by
// itself: it must keep them for the client's Policy.Retention.
type retainer interface {
	Retain(d time.Duration)
}

// sharedJournal is implemented by a [Journal] that a fleet of processes
// shares (contrib/postgres's, journaltest.FleetModel's): the moment Begin
// returns, another worker's Begin of the same operation may find the
// entry, take its lease and send under its key. A key minted for a call
// is then no longer the call's alone: a 409 to its first attempt may be
// that worker's request in progress, not the application's answer. A
// journal whose declaration says one process (journal_identity.go) but
// that has ClaimPending anywhere along its chain is taken for shared:
// the evidence that fails closed wins.
type sharedJournal interface {
	ClaimPending(ctx context.Context, limit int) ([]*Entry, error)
}

// journalClock is implemented by a [Journal] that keeps its own clock: it
// stamps the entries and outcomes it is given with zero times, and the
// client judges their ages by Now, so that one clock ages the entries of
// every process sharing the journal.
type journalClock interface {
	Now(ctx context.Context) (time.Time, error)
}

// stamp returns the time to write into an entry or outcome for j: zero
// for a journal with its own clock, which stamps it, else the client's.
func (c *Client) stamp(j Journal) time.Time {
	if _, ok := journalAs[journalClock](c.cfg.identity(j)); ok {
		return time.Time{}
	}
	return c.cfg.now()
}

// journalNow returns the time by which j's entries are aged: j's own
// clock when it keeps one, else the client's.
func (c *Client) journalNow(ctx context.Context, j Journal) (time.Time, error) {
	if jc, ok := journalAs[journalClock](c.cfg.identity(j)); ok {
		t, err := jc.Now(ctx)
		if err != nil {
			return time.Time{}, fmt.Errorf("clock: %w", err)
		}
		return t, nil
	}
	return c.cfg.now(), nil
}
