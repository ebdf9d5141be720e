package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

var key = inbox.Key{IDSpace: "orders", ID: "m-1"}

func record(t *testing.T, l inbox.Ledger) inbox.Record {
	t.Helper()
	// OpExcuse of a message with no run begun changes nothing and reads
	// the record.
	r, err := l.Apply(context.Background(), key, inbox.OpExcuse)
	require.NoError(t, err)
	return r
}

// A shutdown while the handler runs hands the message back at once and
// counts nothing, however often it happens; so does a delivery taken
// ahead and handed back unrun. Only the handler's own failures count, up
// to the limit. (With the shutdown's error counted, the third shutdown
// dead-lettered a healthy message: this test failed.)
func TestRunnerShutdownNeverCounts(t *testing.T) {
	ledger := &inbox.MemoryLedger{}
	var calls atomic.Int32
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		r := &inbox.Runner{Policy: inbox.Policy{Retry: inbox.Retry{MaxDeliveries: 3}}, Ledger: ledger,
			Handler: func(ctx context.Context, _ *inbox.Message) error {
				calls.Add(1)
				cancel() // the shutdown arrives while it runs
				<-ctx.Done()
				return ctx.Err()
			}}
		dec, d := r.Deliver(ctx, &inbox.Message{ID: key.ID}, key, inbox.Arrival{HasID: true, MaybeRedelivered: true}, inbox.Hooks{})
		assert.Equal(t, inbox.Decision{Verb: inbox.VerbRequeue}, dec)
		assert.Equal(t, inbox.StateHandedBack, d.State())
		dec, _ = r.Deliver(ctx, &inbox.Message{ID: key.ID}, key, inbox.Arrival{HasID: true, Stopping: true, MaybeRedelivered: true}, inbox.Hooks{})
		assert.Equal(t, inbox.Decision{Verb: inbox.VerbRequeue}, dec, "taken ahead: back unrun")
	}
	assert.Equal(t, int32(5), calls.Load())
	assert.Equal(t, inbox.Record{}, record(t, ledger), "nothing counted")
}

// A failing handler is retried with a growing delay, counted in the
// ledger, and dead-lettered on its last allowed failure. The record goes
// only once the adapter says the dead letter is done: a dead letter that
// fails keeps the count, so the redelivery is dead-lettered on arrival
// without running; once done, a later copy of the message starts afresh
// (an operator's redrive from the dead-letter queue runs again).
// Checked to fail with the core forgetting before the dead letter
// (closeThen(OpForget, ...) in place of deadLetter: the record is gone
// after the failed dead letter and the handler runs a fourth time).
func TestRunnerPoison(t *testing.T) {
	ledger := &inbox.MemoryLedger{}
	boom := errors.New("cannot parse")
	retry := inbox.Retry{Delay: time.Second, MaxDeliveries: 3}
	var calls atomic.Int32
	r := &inbox.Runner{Policy: inbox.Policy{Retry: retry}, Ledger: ledger,
		Handler: func(context.Context, *inbox.Message) error { calls.Add(1); return boom }}
	m := &inbox.Message{ID: key.ID}
	ctx := context.Background()
	for i := 1; i <= 2; i++ {
		dec, _ := r.Deliver(ctx, m, key, inbox.Arrival{HasID: true, MaybeRedelivered: i > 1}, inbox.Hooks{})
		assert.Equal(t, inbox.Decision{Verb: inbox.VerbRequeue, Delay: retry.After(i), Err: boom, Failures: i}, dec)
	}
	dec, d := r.Deliver(ctx, m, key, inbox.Arrival{HasID: true, MaybeRedelivered: true}, inbox.Hooks{})
	assert.Equal(t, inbox.Decision{Verb: inbox.VerbDeadLetter, Err: boom, Failures: 3, Report: true}, dec)
	assert.Equal(t, inbox.StateDeadLettering, d.State())
	assert.Equal(t, inbox.Record{Failures: 3}, record(t, ledger), "kept until the dead letter is done")

	dlDown := errors.New("dead-letter queue down")
	dec = r.DeadLettered(ctx, d, key, dlDown)
	assert.Equal(t, inbox.VerbRequeue, dec.Verb)
	assert.Equal(t, retry.After(3), dec.Delay)
	assert.ErrorIs(t, dec.Err, dlDown)
	assert.Equal(t, inbox.StateDeadLetterFailed, d.State())
	assert.Equal(t, inbox.Record{Failures: 3}, record(t, ledger), "the failed dead letter kept the count")

	dec, d = r.Deliver(ctx, m, key, inbox.Arrival{HasID: true, MaybeRedelivered: true}, inbox.Hooks{})
	assert.Equal(t, inbox.VerbDeadLetter, dec.Verb)
	assert.ErrorIs(t, dec.Err, inbox.ErrExhausted, "dead-lettered on arrival")
	assert.Equal(t, int32(3), calls.Load(), "not run again")
	assert.Equal(t, inbox.Decision{}, r.DeadLettered(ctx, d, key, nil))
	assert.Equal(t, inbox.StateDeadLettered, d.State())
	assert.Equal(t, inbox.Record{}, record(t, ledger), "forgotten once dead-lettered")
}

// Runs the process died in (OpBegin with no end) count: a message that
// kept killing its consumers arrives past the limit and is dead-lettered
// without running. (With Running left out of the count, the handler ran
// a fourth time: this test failed.)
func TestRunnerCrashesCount(t *testing.T) {
	ledger := &inbox.MemoryLedger{}
	for range 3 { // three processes that died in the handler
		_, err := ledger.Apply(context.Background(), key, inbox.OpBegin)
		require.NoError(t, err)
	}
	var calls atomic.Int32
	r := &inbox.Runner{Policy: inbox.Policy{Retry: inbox.Retry{MaxDeliveries: 3}}, Ledger: ledger,
		Handler: func(context.Context, *inbox.Message) error { calls.Add(1); return nil }}
	dec, _ := r.Deliver(context.Background(), &inbox.Message{ID: key.ID}, key, inbox.Arrival{HasID: true, MaybeRedelivered: true}, inbox.Hooks{})
	assert.Equal(t, inbox.VerbDeadLetter, dec.Verb)
	assert.ErrorIs(t, dec.Err, inbox.ErrExhausted)
	assert.Equal(t, 3, dec.Failures)
	assert.Zero(t, calls.Load())
}

// Past the processing limit, the failure is counted before the message
// is released, and the late return of the hung handler settles nothing.
// (With Release called before the ledger's write, the release saw no
// failure: this test failed.)
func TestRunnerLimitCountsThenReleases(t *testing.T) {
	ledger := &inbox.MemoryLedger{}
	unblock := make(chan struct{})
	var atRelease inbox.Record
	r := &inbox.Runner{Ledger: ledger, Limit: 10 * time.Millisecond,
		Handler: func(context.Context, *inbox.Message) error { <-unblock; return nil }}
	dec, d := r.Deliver(context.Background(), &inbox.Message{ID: key.ID}, key, inbox.Arrival{HasID: true}, inbox.Hooks{
		Release: func() { atRelease = record(t, ledger); close(unblock) },
	})
	assert.Equal(t, inbox.Decision{}, dec, "spent: nothing more to tell the broker")
	assert.Equal(t, inbox.StateReleased, d.State())
	assert.Equal(t, inbox.Record{Failures: 1}, atRelease)
}

// A ledger that cannot be read or written: nothing runs unmarked, nothing
// is counted, the message comes back after a delay.
func TestRunnerLedgerDown(t *testing.T) {
	var calls atomic.Int32
	r := &inbox.Runner{Ledger: downLedger{}, Handler: func(context.Context, *inbox.Message) error { calls.Add(1); return errors.New("boom") }}
	dec, d := r.Deliver(context.Background(), &inbox.Message{ID: key.ID}, key, inbox.Arrival{HasID: true, MaybeRedelivered: true}, inbox.Hooks{})
	assert.Equal(t, inbox.Decision{Verb: inbox.VerbRequeue, Delay: inbox.DefaultRetryDelay}, dec)
	assert.Equal(t, inbox.StateDeferred, d.State())
	assert.Zero(t, calls.Load())
	dec, d = r.Deliver(context.Background(), &inbox.Message{ID: key.ID}, key, inbox.Arrival{HasID: true}, inbox.Hooks{})
	assert.Equal(t, inbox.VerbRequeue, dec.Verb)
	assert.Equal(t, inbox.StateDeferred, d.State(), "the failure could not be counted")
	assert.Equal(t, int32(1), calls.Load())
}

type downLedger struct{}

func (downLedger) Apply(context.Context, inbox.Key, inbox.Op) (inbox.Record, error) {
	return inbox.Record{}, errors.New("database down")
}

// A handler whose commit applied but whose answer was lost (inbox.SQL
// returns "outcome unknown; a redelivery is safe") fails in the Runner's
// eyes; the ledger's answer to the failure says the message is
// processed, and the core acks it and forgets its record, even on its
// last allowed run: never a dead letter of a message whose effect
// committed (found by internal/msgsim, seed 8022). Checked to fail with
// storeLedger's OpFail and OpFailBegun not reading the inbox
// (dead-lettered), and with the core's StateFailing ignoring
// Record.Processed (requeued with a delay instead of acked).
func TestRunnerLostCommitAnswerIsNotDeadLettered(t *testing.T) {
	store := inboxtest.NewStore()
	_, err := store.Ledger().Apply(context.Background(), key, inbox.OpFail) // an earlier run failed
	require.NoError(t, err)
	r := &inbox.Runner{Policy: inbox.Policy{Retry: inbox.Retry{MaxDeliveries: 2}}, Ledger: store.Ledger(),
		Handler: func(ctx context.Context, m *inbox.Message) error {
			tx, dup, err := store.Begin(key)
			require.NoError(t, err)
			require.False(t, dup)
			require.NoError(t, tx.Commit())
			return errors.New("inbox: commit (outcome unknown; a redelivery is safe): connection reset")
		}}
	dec, d := r.Deliver(context.Background(), &inbox.Message{ID: key.ID, IDSpace: key.IDSpace}, key, inbox.Arrival{HasID: true, MaybeRedelivered: true}, inbox.Hooks{})
	assert.Equal(t, 1, store.Effects(key.ID))
	assert.Equal(t, inbox.Decision{Verb: inbox.VerbAck}, dec, "a processed message is acked, not dead-lettered")
	assert.Equal(t, inbox.StateAcked, d.State())
	assert.Equal(t, inbox.Record{}, record(t, store.Ledger()), "the record forgotten")
}
