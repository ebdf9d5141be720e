package idemhttp

import (
	"bytes"
	"context"
	"fmt"
	"io"
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
	// the operation reuses the key, then pruned.
	StateDone State = "done"
	// StateAbandoned: the entry outlived the server's key retention while
	// pending, so it was not resent ([ErrKeyExpired]). A person or a
	// reconciliation step must decide what happened.
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
}

// Outcome is what [Journal.Finish] records at the end of a call.
type Outcome struct {
	State    State     // the entry's new state
	Status   int       // status of the last response, 0 if none; replaces Entry.LastStatus
	Attempts int       // attempts this call made; added to Entry.Attempts
	At       time.Time // when the call ended
}

// Journal records pending idempotency keys durably, so that a process that
// dies mid-request resends the operation with the same key after a restart
// instead of minting a new one and running it twice.
//
// Implementations must be safe for concurrent use. [FileJournal] is the
// embedded default; the journaltest package holds the conformance suite
// every implementation must pass.
type Journal interface {
	// Begin records e as pending and makes it durable before returning,
	// unless the journal already holds an entry with e.Operation (when not
	// empty) or, failing that, with e.Key. Then Begin writes nothing and
	// returns that entry (the operation's, when both exist). The check and the write are one atomic step,
	// so concurrent calls for one operation agree on a single key.
	Begin(ctx context.Context, e *Entry) (existing *Entry, err error)

	// Finish records the outcome of the call that sent key's operation.
	// It returns an error wrapping [ErrNotFound] for an unknown key.
	//
	// Finish may return before the outcome is durable ([FileJournal]
	// writes it behind, with the next group commit), provided it becomes
	// durable no later than any later Begin that stores an entry. Losing it in
	// a crash is safe: the entry is still pending after the restart, and
	// Resume resends it under the same key, which the server answers from
	// its stored response. What must never be lost is a Begin.
	Finish(ctx context.Context, key string, o Outcome) error

	// Get returns the entry for key, or an error wrapping [ErrNotFound].
	Get(ctx context.Context, key string) (*Entry, error)

	// Lookup returns the entry for operation (an id given to
	// [WithOperation]), or an error wrapping [ErrNotFound]. It is meant
	// for skipping operations already done, many at a time: an
	// implementation may leave out the request (Method, URL, Header, Body
	// and Fingerprint) to avoid reading it; Get(ctx, e.Key) returns it.
	Lookup(ctx context.Context, operation string) (*Entry, error)

	// Pending returns the entries in state pending, oldest first.
	Pending(ctx context.Context) ([]*Entry, error)

	// Prune deletes the done entries last updated before cutoff and returns
	// how many it deleted. Pending and abandoned entries are never pruned:
	// they describe operations whose outcome nobody knows yet.
	Prune(ctx context.Context, cutoff time.Time) (int, error)
}

// memJournal is the Journal a Client uses when it has none and a call
// names an operation: keys live for the life of the Client, so an
// operation retried by the caller reuses its key and a changed body is
// refused locally. Done entries older than the retention are pruned as
// new ones arrive.
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
		m.pruneLocked(e.Created.Add(-m.retention))
	}
	m.byKey[e.Key] = cloneEntry(e)
	if e.Operation != "" {
		m.byOp[e.Operation] = e.Key
	}
	return nil, nil
}

func (m *memJournal) Finish(_ context.Context, key string, o Outcome) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return fmt.Errorf("finish %s: %w", key, ErrNotFound)
	}
	e.State, e.LastStatus, e.Updated = o.State, o.Status, o.At
	e.Attempts += o.Attempts
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
	return &c
}

// ResumeResult is the outcome of resending one pending entry.
type ResumeResult struct {
	Entry      *Entry      // the entry as it was before the resend
	StatusCode int         // the response status, 0 if none
	Header     http.Header // the response headers, nil if none
	Body       []byte      // the response body, up to Policy.MaxBodyBytes
	Replayed   bool        // the server replayed a stored response
	Err        error       // why the entry was not resolved, nil if it was
}

// Resume resends every pending entry of the journal (c.Journal, or the
// in-memory one) with its original key and body, one at a time, oldest
// first, and reports each outcome. Credentials come from
// [Client.PrepareRequest], never from the journal.
//
// An entry older than [Policy.Retention] is not resent: the server may have
// forgotten its key, so a resend could run the operation twice. It is
// marked abandoned and reported with an error wrapping [ErrKeyExpired]. An
// entry whose body was not stored cannot be resent either ([ErrNotReplayable]).
// Nor is an entry when the clock is behind the journal (an entry created
// or updated in the future, by more than [ClockTolerance]): its age cannot
// be known, so every entry is reported with an error wrapping
// [ErrClockJump] and left pending.
// Done entries older than the retention are pruned.
//
// The error is non-nil only when the journal itself fails; per-entry
// failures are in the results. Cancelling ctx stops the loop; entries not
// reached stay pending.
func (c *Client) Resume(ctx context.Context) ([]ResumeResult, error) {
	c.init()
	j := c.Journal
	if j == nil {
		j = c.mem
	}
	now := time.Now()
	if _, err := j.Prune(ctx, now.Add(-c.pol.retention)); err != nil {
		return nil, fmt.Errorf("idemhttp: resume: prune: %w", err)
	}
	pending, err := j.Pending(ctx)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: resume: %w", err)
	}
	results := make([]ResumeResult, 0, len(pending))
	// The newest time the journal holds: a clock below it was set back,
	// and every entry's age is then in doubt, not only the future ones'.
	var newest time.Time
	for _, e := range pending {
		newest = latest(newest, e.Created, e.Updated)
	}
	for _, e := range pending {
		if err := ctx.Err(); err != nil {
			return results, err
		}
		if newest.After(now.Add(ClockTolerance)) {
			results = append(results, ResumeResult{Entry: e, Err: fmt.Errorf("idemhttp: resume %s: %w: the journal holds times up to %s, the clock says %s",
				e.Key, ErrClockJump, newest.Format(time.RFC3339), now.Format(time.RFC3339))})
			continue
		}
		results = append(results, c.resumeOne(ctx, j, e, now))
	}
	return results, nil
}

// ClockTolerance is how far ahead of the clock a journaled time may be
// before [Client.Resume] and [Client.Do] take it as a clock that was set
// back ([ErrClockJump]): clocks of machines sharing a journal, and one
// machine's clock stepped by NTP, disagree by that much.
const ClockTolerance = time.Minute

func latest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}

// ResumeEntry resends one pending entry of the client's journal, as
// [Client.Resume] does for each: with its key and stored body, never past
// the retention ([ErrKeyExpired]). Use it to resume entries concurrently,
// or entries a worker claimed from a shared journal.
func (c *Client) ResumeEntry(ctx context.Context, e *Entry) ResumeResult {
	c.init()
	j := c.Journal
	if j == nil {
		j = c.mem
	}
	return c.resumeOne(ctx, j, e, time.Now())
}

func (c *Client) resumeOne(ctx context.Context, j Journal, e *Entry, now time.Time) ResumeResult {
	r := ResumeResult{Entry: e}
	if t := latest(e.Created, e.Updated); t.After(now.Add(ClockTolerance)) {
		r.Err = fmt.Errorf("idemhttp: resume %s (created %s): %w", e.Key, e.Created.Format(time.RFC3339), ErrClockJump)
		return r
	}
	if now.Sub(e.Created) > c.pol.retention {
		if err := j.Finish(ctx, e.Key, Outcome{State: StateAbandoned, Status: e.LastStatus, At: now}); err != nil {
			r.Err = fmt.Errorf("idemhttp: resume %s: %w", e.Key, err)
			return r
		}
		r.Err = fmt.Errorf("idemhttp: resume %s (created %s): %w", e.Key, e.Created.Format(time.RFC3339), ErrKeyExpired)
		return r
	}
	if e.Body == nil && Fingerprint(e.Method, e.URL, nil) != e.Fingerprint {
		r.Err = fmt.Errorf("idemhttp: resume %s: %w: the journal does not store bodies", e.Key, ErrNotReplayable)
		return r
	}
	rctx := WithKey(ctx, e.Key)
	if e.Operation != "" {
		rctx = WithOperation(rctx, e.Operation)
	}
	var body io.Reader
	if e.Body != nil {
		body = bytes.NewReader(e.Body)
	}
	req, err := http.NewRequestWithContext(rctx, e.Method, e.URL, body)
	if err != nil {
		r.Err = fmt.Errorf("idemhttp: resume %s: %w: %w", e.Key, ErrInvalidRequest, err)
		return r
	}
	for k, v := range e.Header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		r.Err = err
		return r
	}
	defer resp.Body.Close()
	r.StatusCode, r.Header, r.Replayed = resp.StatusCode, resp.Header, Replayed(resp)
	r.Body, r.Err = io.ReadAll(io.LimitReader(resp.Body, c.pol.maxBody))
	return r
}
