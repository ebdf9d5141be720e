package inbox

import (
	"context"
	"sync"
)

// Key names a message in a [Ledger]: its id within its id space. The
// consumer is the ledger's own (see [SQL.Ledger]).
type Key struct {
	// IDSpace is the message's [Message.IDSpace].
	IDSpace string
	// ID is the message's id ([Message.ID]), or, for a consumer that
	// dedups by position instead ([Message.ID] empty: Kafka's offsets in
	// the database), the message's position.
	ID string
}

// Ledger is the inbox's durable record of what happened to each message's
// handler runs: how many failed, and how many began and never ended (the
// process died). The message core ([Delivery]) decides from it, never
// from a broker's delivery counter, when a message is dead-lettered and
// how long a failed one stays away; see [Op] for what each write does.
//
// Keep it in the database of the inbox ([SQL.Ledger]; contrib/postgres's
// Inbox.Ledger), so that every instance of a consumer, and every restart,
// share one count, and the answers of OpBegin, OpFail and OpFailBegun can
// say a message is processed ([Record.Processed]): a redelivery of it is
// acked unrun, and a run that failed after its effect committed (a commit
// whose answer was lost) is acked, never dead-lettered. [MemoryLedger]
// counts within one process only, and cannot tell a processed message.
//
// Implementations must be safe for concurrent use. An error means the
// write may or may not have happened: the core then counts nothing and
// hands the message back after a delay.
type Ledger interface {
	// Apply makes the write op for the message k and returns the record:
	// as it was before, for OpBegin; after it, for the others (zero for
	// OpForget). For OpBegin, OpFail and OpFailBegun of a message the
	// inbox holds as processed, it writes nothing and returns
	// Record{Processed: true}.
	Apply(ctx context.Context, k Key, op Op) (Record, error)
}

// DefaultMemoryLedgerSize is how many messages a [MemoryLedger] with a
// zero MaxRecords remembers.
const DefaultMemoryLedgerSize = 4096

// MemoryLedger is a [Ledger] in this process's memory: it counts the
// failures of the handler runs this process sees, and forgets them when
// the process ends. Adapters use one of their own when their Ledger is
// nil. With it, a message that kills its process is never counted, and
// every instance of a consumer counts alone: a poison message gets up to
// the limit per instance.
//
// It cannot tell a processed message: it sees no inbox, so its answers
// never say [Record.Processed]. A redelivery of a processed message then
// runs its handler (which the inbox makes a duplicate, acked), and a
// handler that fails after its effect committed (a commit whose answer
// was lost: "outcome unknown") is counted as a failure like any other:
// on its last allowed run the message is dead-lettered although its
// effect committed, and replaying that dead letter runs the effect again
// unless the handler dedups (an inbox's Handle does). Give the adapter
// the inbox's ledger ([SQL.Ledger]) to have these acked.
//
// It remembers at most MaxRecords messages, forgetting an arbitrary one
// past that (so a message may get more runs than the limit, never fewer).
// The zero value is ready to use; it is safe for concurrent use.
type MemoryLedger struct {
	// MaxRecords bounds the messages remembered; zero means
	// [DefaultMemoryLedgerSize].
	MaxRecords int

	mu      sync.Mutex
	records map[Key]Record
}

var _ Ledger = (*MemoryLedger)(nil)

// Apply implements [Ledger]. It fails only on a done ctx, and on a key
// without an id ([ErrNoMessageID]).
func (l *MemoryLedger) Apply(ctx context.Context, k Key, op Op) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	if k.ID == "" {
		return Record{}, ErrNoMessageID
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.records == nil {
		l.records = make(map[Key]Record)
	}
	r, ok := l.records[k]
	before := r
	switch op {
	case OpBegin:
		r.Running++
	case OpFail:
		r.Failures++
	case OpFailBegun:
		r.Failures++
		r.Running = max(r.Running-1, 0)
	case OpExcuse:
		if !ok {
			return Record{}, nil
		}
		r.Running = max(r.Running-1, 0)
	case OpForget:
		delete(l.records, k)
		return Record{}, nil
	case OpTombstone:
		// No inbox to hold a tombstone: nothing to write.
		return r, nil
	default:
		return Record{}, nil
	}
	if !ok {
		limit := l.MaxRecords
		if limit <= 0 {
			limit = DefaultMemoryLedgerSize
		}
		for k := range l.records {
			if len(l.records) < limit {
				break
			}
			delete(l.records, k)
		}
	}
	l.records[k] = r
	if op == OpBegin {
		return before, nil
	}
	return r, nil
}
