package inboxtest

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
)

// LedgerFixture is a ledger under test: [RunLedger] runs its suite on it.
type LedgerFixture struct {
	// Ledger is the ledger, empty.
	Ledger inbox.Ledger
	// Process records the message k as processed in the inbox the ledger
	// reads, as the inbox's Handle would (its effect committed); nil for
	// a ledger that cannot tell ([inbox.MemoryLedger]). It must fail
	// with [inbox.ErrDeadLettered] for a message whose tombstone
	// ([inbox.OpTombstone]) the inbox holds.
	Process func(ctx context.Context, k inbox.Key) error
	// Redrive clears a dead-lettered message's tombstone and its record
	// (inbox.SQLLedger's Redrive); nil for a ledger without tombstones.
	Redrive func(ctx context.Context, k inbox.Key) (bool, error)
}

// RunLedger runs the conformance suite of an [inbox.Ledger]: the answers
// of each [inbox.Op] that the message core decides from. open returns a
// new, empty ledger each time it is called. Every ledger (the memory
// one, inbox.SQL's on SQLite and PostgreSQL, contrib/postgres's) runs it,
// so that they cannot drift apart.
func RunLedger(t *testing.T, open func(t *testing.T) LedgerFixture) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, f LedgerFixture)
	}{
		{"CountsRunsAndFailures", testLedgerCounts},
		{"FailWithoutBegin", testLedgerFailWithoutBegin},
		{"ExcuseAndForget", testLedgerExcuseAndForget},
		{"KeysAreSeparate", testLedgerKeys},
		{"ProcessedWritesNothing", testLedgerProcessed},
		{"FailOfProcessedWritesNothing", testLedgerFailProcessed},
		{"TombstoneConflictsWithEffect", testLedgerTombstone},
		{"RedriveClearsTombstone", testLedgerRedrive},
		{"Concurrent", testLedgerConcurrent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open(t)) })
	}
}

func apply(t *testing.T, l inbox.Ledger, k inbox.Key, op inbox.Op) inbox.Record {
	t.Helper()
	r, err := l.Apply(context.Background(), k, op)
	require.NoError(t, err, "%s", op)
	return r
}

// OpBegin answers the record as it was before, and counts a run; a
// failed begun run moves from Running to Failures. (With OpBegin
// answering the record after it, a first delivery looked like a crash:
// this test failed.)
func testLedgerCounts(t *testing.T, f LedgerFixture) {
	k := inbox.Key{IDSpace: "orders", ID: "m-1"}
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpBegin), "nothing before the first run")
	assert.Equal(t, inbox.Record{Running: 1}, apply(t, f.Ledger, k, inbox.OpBegin), "a run that never ended: the process died")
	assert.Equal(t, inbox.Record{Failures: 1, Running: 1}, apply(t, f.Ledger, k, inbox.OpFailBegun))
	assert.Equal(t, inbox.Record{Failures: 1, Running: 1}, apply(t, f.Ledger, k, inbox.OpBegin))
	assert.Equal(t, inbox.Record{Failures: 2, Running: 1}, apply(t, f.Ledger, k, inbox.OpFailBegun))
}

func testLedgerFailWithoutBegin(t *testing.T, f LedgerFixture) {
	k := inbox.Key{ID: "m-1"}
	assert.Equal(t, inbox.Record{Failures: 1}, apply(t, f.Ledger, k, inbox.OpFail))
	assert.Equal(t, inbox.Record{Failures: 2}, apply(t, f.Ledger, k, inbox.OpFail))
	assert.Equal(t, inbox.Record{Failures: 3}, apply(t, f.Ledger, k, inbox.OpFailBegun), "Running never goes below zero")
}

// An excused run leaves no trace; a forgotten message starts again.
// (With OpExcuse not writing, a shutdown counted as a crash: this test
// failed.)
func testLedgerExcuseAndForget(t *testing.T, f LedgerFixture) {
	k := inbox.Key{IDSpace: "orders", ID: "m-1"}
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpExcuse), "nothing to excuse")
	apply(t, f.Ledger, k, inbox.OpFail)
	apply(t, f.Ledger, k, inbox.OpBegin)
	assert.Equal(t, inbox.Record{Failures: 1}, apply(t, f.Ledger, k, inbox.OpExcuse))
	assert.Equal(t, inbox.Record{Failures: 1}, apply(t, f.Ledger, k, inbox.OpBegin), "the excused run is not a crash")
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpForget))
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpBegin), "forgotten")
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpForget))
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpForget), "twice")
}

// Two id spaces, and two long ids sharing a prefix, are separate
// messages; a message without an id is refused.
func testLedgerKeys(t *testing.T, f LedgerFixture) {
	long := strings.Repeat("x", 5000)
	keys := []inbox.Key{{ID: "m-1"}, {IDSpace: "orders", ID: "m-1"}, {IDSpace: "refunds", ID: "m-1"}, {ID: long + "1"}, {ID: long + "2"}, {ID: "\xff\x00"}}
	for i, k := range keys {
		for range i + 1 {
			apply(t, f.Ledger, k, inbox.OpFail)
		}
	}
	for i, k := range keys {
		assert.Equal(t, inbox.Record{Failures: i + 1}, apply(t, f.Ledger, k, inbox.OpExcuse), "%q", k)
	}
	_, err := f.Ledger.Apply(context.Background(), inbox.Key{IDSpace: "orders"}, inbox.OpBegin)
	assert.ErrorIs(t, err, inbox.ErrNoMessageID)
}

// A processed message's OpBegin says so and writes nothing. (With the
// check left out, a redelivered processed message got a marker that
// nothing removed: this test failed.)
func testLedgerProcessed(t *testing.T, f LedgerFixture) {
	if f.Process == nil {
		t.Skip("the ledger cannot tell a processed message")
	}
	ctx := context.Background()
	k := inbox.Key{IDSpace: "orders", ID: "m-1"}
	apply(t, f.Ledger, k, inbox.OpFail)
	require.NoError(t, f.Process(ctx, k))
	assert.Equal(t, inbox.Record{Processed: true}, apply(t, f.Ledger, k, inbox.OpBegin))
	assert.Equal(t, inbox.Record{Processed: true}, apply(t, f.Ledger, k, inbox.OpBegin))
	assert.Equal(t, inbox.Record{Failures: 1}, apply(t, f.Ledger, k, inbox.OpExcuse), "no run was begun")
	other := inbox.Key{IDSpace: "refunds", ID: "m-1"}
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, other, inbox.OpBegin), "another id space's message is not processed")
}

// A failed run of a processed message (a commit that applied, its
// answer lost) is answered as processed, and nothing is counted: the
// core acks the message instead of requeueing or dead-lettering it.
// (Checked to fail with OpFail and OpFailBegun not reading the inbox, in
// each ledger: the failures were counted and Processed was false.)
func testLedgerFailProcessed(t *testing.T, f LedgerFixture) {
	if f.Process == nil {
		t.Skip("the ledger cannot tell a processed message")
	}
	ctx := context.Background()
	k := inbox.Key{IDSpace: "orders", ID: "m-1"}
	apply(t, f.Ledger, k, inbox.OpFail)
	apply(t, f.Ledger, k, inbox.OpBegin)
	require.NoError(t, f.Process(ctx, k))
	assert.Equal(t, inbox.Record{Processed: true}, apply(t, f.Ledger, k, inbox.OpFailBegun))
	assert.Equal(t, inbox.Record{Processed: true}, apply(t, f.Ledger, k, inbox.OpFail))
	assert.Equal(t, inbox.Record{Failures: 1}, apply(t, f.Ledger, k, inbox.OpExcuse), "nothing counted: one failure, the run's marker excused")
	other := inbox.Key{IDSpace: "refunds", ID: "m-1"}
	assert.Equal(t, inbox.Record{Failures: 1}, apply(t, f.Ledger, other, inbox.OpFail), "another id space's message is not processed")
	assert.Equal(t, inbox.Record{Failures: 2}, apply(t, f.Ledger, other, inbox.OpFailBegun))
}

// A dead letter's tombstone and the effect conflict on the inbox's row of
// the id: once the effect committed, OpTombstone says Processed (the core
// acks, never dead-letters); once the tombstone is there, the effect's
// transaction runs nothing (ErrDeadLettered), and OpBegin, OpFail and
// OpFailBegun say DeadLettered, writing nothing, even after the record is
// forgotten (the dead letter done). So an effect and a dead letter of one
// message cannot both commit: a run live elsewhere (an ack wait that
// ended, a Kafka zombie) loses to the dead letter, or the dead letter to
// it (internal/msgsim's overlap and zombie limits). (Checked to fail, on
// each ledger, with OpTombstone writing no row: Process ran.)
func testLedgerTombstone(t *testing.T, f LedgerFixture) {
	if f.Process == nil {
		t.Skip("the ledger sees no inbox: no tombstones")
	}
	ctx := context.Background()
	done := inbox.Key{IDSpace: "orders", ID: "m-1"}
	apply(t, f.Ledger, done, inbox.OpFail)
	require.NoError(t, f.Process(ctx, done))
	assert.Equal(t, inbox.Record{Processed: true}, apply(t, f.Ledger, done, inbox.OpTombstone), "the effect committed first: no dead letter")

	k := inbox.Key{IDSpace: "orders", ID: "m-2"}
	apply(t, f.Ledger, k, inbox.OpBegin)
	apply(t, f.Ledger, k, inbox.OpFailBegun)
	assert.Equal(t, inbox.Record{Failures: 1, DeadLettered: true}, apply(t, f.Ledger, k, inbox.OpTombstone))
	assert.ErrorIs(t, f.Process(ctx, k), inbox.ErrDeadLettered, "the effect cannot commit after the tombstone")
	assert.Equal(t, inbox.Record{DeadLettered: true}, apply(t, f.Ledger, k, inbox.OpBegin))
	assert.Equal(t, inbox.Record{DeadLettered: true}, apply(t, f.Ledger, k, inbox.OpFail))
	assert.Equal(t, inbox.Record{DeadLettered: true}, apply(t, f.Ledger, k, inbox.OpFailBegun))
	assert.Equal(t, inbox.Record{Failures: 1, DeadLettered: true}, apply(t, f.Ledger, k, inbox.OpTombstone), "twice: a dead letter sent again")
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpForget))
	assert.Equal(t, inbox.Record{DeadLettered: true}, apply(t, f.Ledger, k, inbox.OpBegin), "the tombstone outlives the record")
	assert.ErrorIs(t, f.Process(ctx, k), inbox.ErrDeadLettered)
	other := inbox.Key{IDSpace: "refunds", ID: "m-2"}
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, other, inbox.OpBegin), "another id space's message is not dead-lettered")
	require.NoError(t, f.Process(ctx, other))
}

// An operator's redrive clears the tombstone (and the record) first; the
// message then runs as new. A processed message's row is never cleared.
// (Checked to fail with Redrive deleting the row whatever its format: the
// processed message ran again.)
func testLedgerRedrive(t *testing.T, f LedgerFixture) {
	if f.Redrive == nil {
		t.Skip("the ledger has no tombstones")
	}
	ctx := context.Background()
	k := inbox.Key{ID: "m-1"}
	apply(t, f.Ledger, k, inbox.OpFail)
	apply(t, f.Ledger, k, inbox.OpTombstone)
	assert.ErrorIs(t, f.Process(ctx, k), inbox.ErrDeadLettered, "no id space: the consumer's own row")
	was, err := f.Redrive(ctx, k)
	require.NoError(t, err)
	assert.True(t, was)
	assert.Equal(t, inbox.Record{}, apply(t, f.Ledger, k, inbox.OpBegin), "a new start: no tombstone, no count")
	require.NoError(t, f.Process(ctx, k), "the redriven message runs")
	was, err = f.Redrive(ctx, k)
	require.NoError(t, err)
	assert.False(t, was, "processed: nothing to clear")
	assert.Equal(t, inbox.Record{Processed: true}, apply(t, f.Ledger, k, inbox.OpBegin), "still processed")
	_, err = f.Redrive(ctx, inbox.Key{})
	assert.ErrorIs(t, err, inbox.ErrNoMessageID)
}

// Counts from many deliveries at once add up.
func testLedgerConcurrent(t *testing.T, f LedgerFixture) {
	k := inbox.Key{IDSpace: "orders", ID: "m-1"}
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for range n {
		wg.Go(func() {
			_, err := f.Ledger.Apply(context.Background(), k, inbox.OpBegin)
			errs <- err
			_, err = f.Ledger.Apply(context.Background(), k, inbox.OpFailBegun)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, inbox.Record{Failures: n}, apply(t, f.Ledger, k, inbox.OpExcuse))
}
