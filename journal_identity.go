package idemhttp

import (
	"fmt"
	"reflect"

	"github.com/idemkit/idemhttp/internal/contract"
)

// This file is a journal's identity as the client sees it through the
// caller's wrappers: which journal holds the entries (the scope of the
// senders' slots, senders.go), whether anyone the client cannot see may
// send under its keys, and where its optional methods are. Resolved once
// per Client (config.init); docs/lifecycle.md, "One sender at a time".

// journalUnwrapper is implemented by a [Journal] that wraps another (a
// caller's metrics or tracing decorator): Unwrap returns the journal it
// forwards to, as errors.Unwrap does for errors. See [Journal].
type journalUnwrapper interface {
	Unwrap() Journal
}

// sendersDeclarer is implemented by the project's own journals, which
// declare who sends under their keys (contract.Senders).
type sendersDeclarer interface {
	JournalSenders() contract.Senders
}

// maxUnwrap bounds the walk down a chain of wrappers: a longer chain is
// taken for a cycle, and the journal for one the client cannot see into.
const maxUnwrap = 32

// journalIdentity is what a Client knows of a journal.
type journalIdentity struct {
	// chain is the journal and those it wraps, outermost first: an
	// optional method is looked for in that order (journalAs), so a
	// wrapper's own wins over the journal's it wraps.
	chain []Journal
	// scope is the scope of its senders' slots: the declared store, else
	// the innermost journal reached, else (a value that cannot be a map
	// key) the Client's own.
	scope any
	// known: a journal of the project's declared itself (Senders), so
	// scope is the store's own identity, and every Client of this process
	// that reaches the store shares its slots: a call may withdraw the
	// entry it created and never sent, and no Client of the process can be
	// sending under it meanwhile (another process is fenced by the
	// journal itself). Unknown (a user's journal, a wrapper without
	// Unwrap), the withdrawal is refused and the entry stays pending.
	known bool
	// oneProcess: known, and no other process sends under its keys, nor
	// does it have ClaimPending: a key minted for a call is the call's
	// alone until its first attempt, so a 409 to that attempt is the
	// application's answer (the fresh-key rule).
	oneProcess bool
}

// resolveJournal walks j's chain of wrappers once: bounded, nil-safe,
// stopping at a cycle, and fail-closed on a wrapper whose Unwrap or
// declaration panics. own is the scope of a journal whose value cannot be
// a map key.
func resolveJournal(j Journal, own any) (id journalIdentity) {
	id.scope = own
	if j == nil {
		return id
	}
	var decl *contract.Senders
	complete := false // the walk reached a journal that wraps nothing
	func() {
		defer func() {
			if recover() != nil { // a caller's Unwrap or declaration panicked: see no further
				complete = false
			}
		}()
		for cur := j; cur != nil; {
			if seen(id.chain, cur) || len(id.chain) == maxUnwrap {
				return // a cycle, or too deep to tell: the end is not seen
			}
			id.chain = append(id.chain, cur)
			u, ok := cur.(journalUnwrapper)
			var next Journal
			if ok {
				next = u.Unwrap()
			}
			if next == nil {
				// The end of the walk: the journal that holds the
				// entries. Only its declaration counts: a wrapper
				// that embeds a journal of the project's (and so
				// promotes its declaration) but unwraps to another
				// journal speaks for a journal that does not hold
				// them (attack6).
				if d, ok := cur.(sendersDeclarer); ok {
					s := d.JournalSenders()
					decl = &s
				}
				complete = true
				return
			}
			cur = next
		}
	}()
	if decl != nil && complete && decl.Store != nil && reflect.ValueOf(decl.Store).Comparable() {
		_, claims := journalAs[sharedJournal](&id)
		id.scope, id.known, id.oneProcess = decl.Store, true, decl.OneProcess && !claims
		return id
	}
	if n := len(id.chain); n > 0 && reflect.ValueOf(id.chain[n-1]).Comparable() {
		id.scope = id.chain[n-1]
	}
	return id
}

// seen reports whether j is already in chain: a cycle. A value that
// cannot be compared is taken for a new one (the walk is bounded anyway).
func seen(chain []Journal, j Journal) bool {
	if !reflect.ValueOf(j).Comparable() {
		return false
	}
	for _, c := range chain {
		if reflect.TypeOf(c) == reflect.TypeOf(j) && c == j {
			return true
		}
	}
	return false
}

// journalAs returns the first journal of id's chain, outermost first,
// that implements T: a wrapper's own optional method wins over the one
// of the journal it wraps.
func journalAs[T any](id *journalIdentity) (T, bool) {
	for _, j := range id.chain {
		if t, ok := j.(T); ok {
			return t, true
		}
	}
	var zero T
	return zero, false
}

// identity returns what cfg knows of j: its Client's Journal or its
// in-memory one.
func (cfg *config) identity(j Journal) *journalIdentity {
	if m, ok := j.(*memJournal); ok && m == cfg.mem {
		return &cfg.memID
	}
	return &cfg.jid
}

// resolveJournals resolves the Client's journals once (init).
func (cfg *config) resolveJournals(j Journal) {
	cfg.memID = resolveJournal(cfg.mem, cfg)
	cfg.jid = resolveJournal(j, cfg)
	cfg.scope = cfg.jid.scope
	if r, ok := journalAs[retainer](&cfg.jid); ok {
		// Policy.Retention is the one retention setting: a journal that
		// prunes by itself must not drop a done entry the client would
		// still reuse the key of.
		r.Retain(cfg.pol.retention)
	}
}

// JournalSenders declares the in-memory journal one Client's
// (contract.Senders).
func (m *memJournal) JournalSenders() contract.Senders {
	return contract.Senders{Store: m, OneProcess: true}
}

// oneProcess reports whether a's journal is known to have no sender the
// client cannot see: see journalIdentity.
func (a *operation) oneProcess() bool { return a.cfg.identity(a.j).oneProcess }

// mayWithdraw reports whether a's journal is known well enough for the
// call to withdraw the entry it created and never sent: see
// journalIdentity.
func (a *operation) mayWithdraw() bool { return a.cfg.identity(a.j).known }

// keptUnsent is the error of a call that provably sent nothing but whose
// entry stays pending (outcome): the journal is not known to the client,
// so it cannot tell that no sender out of its sight (another Client
// through a wrapper of its own, another process) sends under the key.
// Fail closed: not ErrNotSent, since a rerun under a new key could run
// the operation twice; the entry is Resume's, or a rerun's of the
// operation under its key.
func (a *operation) keptUnsent(err error) error {
	if err == nil || a.reached || !a.created || a.entry == nil {
		return err
	}
	return &keptPendingError{err: err, key: a.entry.Key, operation: a.entry.Operation}
}

// keptPendingError is keptUnsent's error. The call's own error stays
// reachable; it never matches ErrNotSent.
type keptPendingError struct {
	err       error
	key       string
	operation string
}

func (k *keptPendingError) Error() string {
	return fmt.Sprintf("%v; nothing was sent by this call, but its journal is not known to the client (a journal of its own, or a wrapper without Unwrap), "+
		"so another sender may be using the key: the entry (operation %q, key %s) stays pending, for Resume or a rerun of the operation; do not retry under a new key",
		k.err, k.operation, k.key)
}

func (k *keptPendingError) Unwrap() error { return k.err }

// scopeOf returns the slots' scope of x, a Journal (resolved as a Client
// resolves it) or a scope already, for senders.waiters and held; nil for
// a journal whose scope would be its Client's own.
func scopeOf(x any) any {
	j, ok := x.(Journal)
	if !ok {
		return x
	}
	return resolveJournal(j, nil).scope
}
