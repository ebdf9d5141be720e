package sqlite_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
)

// TestAttack5BatchAcksATombstoneWhoseDeadLetterFailed: a consumer that
// processes in batches and falls back to one message at a time (Handle,
// with the core's dead letters) for a batch that fails: the poison
// message m-1 reaches its dead letter, the ledger writes its tombstone
// (OpTombstone), and the dead letter fails (the broker's dead-letter
// queue is down): the core requeues the message, the tombstone stays. Its
// redelivery comes back in a batch: ProcessBatch of several ids reads no
// tombstone and answers Duplicate, so the batch is acked and m-1 is lost:
// never processed, never dead-lettered, and nothing says so. Process (a
// batch of one) answers ErrDeadLettered for the same id, and the core
// dead-letters it again.
//
// Fixed (fail closed): ProcessBatch of several ids fails the batch, before
// anything runs, with an error wrapping inbox.ErrDeadLettered that names
// the message (a batch consumer dead-letters that message again, which is
// idempotent, and redelivers the rest). Checked to fail with
// batchTombstone returning nil: the batch answered Duplicate for m-1.
func TestAttack5BatchAcksATombstoneWhoseDeadLetterFailed(t *testing.T) {
	ctx := context.Background()
	in := migratedInbox(t)
	rec := tombstone(t, in, "billing", "m-1") // then the dead letter fails: requeued
	require.True(t, rec.DeadLettered)

	_, err := in.Process(ctx, "billing", "m-1", func(context.Context, *sql.Tx) error { return nil })
	require.ErrorIs(t, err, inbox.ErrDeadLettered, "a batch of one: the tombstone is read")

	var ran []int
	res, err := in.ProcessBatch(ctx, "billing", []string{"m-1", "m-2"}, func(_ context.Context, _ *sql.Tx, i int) error {
		ran = append(ran, i)
		return nil
	})
	require.ErrorIs(t, err, inbox.ErrDeadLettered, "m-1 never ran and its dead letter failed: never acked as a duplicate")
	assert.Contains(t, err.Error(), `"m-1"`, "the error names the message")
	assert.Nil(t, res)
	assert.Empty(t, ran, "nothing of the batch ran")
}
