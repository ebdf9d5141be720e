package idemhttp

import (
	"context"
	"net/http"
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
	Status   int       // status of the last response, 0 if none
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
	// unless the journal already holds an entry with e.Key or, when
	// e.Operation is not empty, with e.Operation. Then Begin writes nothing
	// and returns that entry. The check and the write are one atomic step,
	// so concurrent calls for one operation agree on a single key.
	Begin(ctx context.Context, e *Entry) (existing *Entry, err error)

	// Finish records the outcome of the call that sent key's operation,
	// durably. It returns an error wrapping [ErrNotFound] for an unknown key.
	Finish(ctx context.Context, key string, o Outcome) error

	// Get returns the entry for key, or an error wrapping [ErrNotFound].
	Get(ctx context.Context, key string) (*Entry, error)

	// Pending returns the entries in state pending, oldest first.
	Pending(ctx context.Context) ([]*Entry, error)

	// Prune deletes the done entries last updated before cutoff and returns
	// how many it deleted. Pending and abandoned entries are never pruned:
	// they describe operations whose outcome nobody knows yet.
	Prune(ctx context.Context, cutoff time.Time) (int, error)
}
