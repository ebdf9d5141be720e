package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
)

// TestInboxBatchFailsOnATombstone: a message whose dead letter failed
// (its tombstone written, the message requeued) comes back in a batch of
// several: the batch fails before anything runs, with an error wrapping
// inbox.ErrDeadLettered that names it, never answering it Duplicate (the
// caller would ack it: neither processed nor dead-lettered, lost). A batch
// without it runs as before. Checked to fail with batchTombstone
// returning nil: m-1 answered Duplicate, m-2 ran.
func TestInboxBatchFailsOnATombstone(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	l := f.in.Ledger("billing")
	k := inbox.Key{ID: "m-1"}
	_, err := l.Apply(ctx, k, inbox.OpBegin)
	require.NoError(t, err)
	_, err = l.Apply(ctx, k, inbox.OpFailBegun)
	require.NoError(t, err)
	rec, err := l.Apply(ctx, k, inbox.OpTombstone)
	require.NoError(t, err)
	require.True(t, rec.DeadLettered)

	var ran []int
	res, err := f.in.ProcessBatch(ctx, "billing", []string{"m-2", "m-1", "m-3"}, func(ctx context.Context, tx pgx.Tx, i int) error {
		ran = append(ran, i)
		return effectTx("billing", []string{"m-2", "m-1", "m-3"}[i])(ctx, tx)
	})
	require.ErrorIs(t, err, inbox.ErrDeadLettered)
	assert.Contains(t, err.Error(), `"m-1"`)
	assert.Nil(t, res)
	assert.Empty(t, ran)
	assert.Zero(t, f.effects(t, "billing", "m-2"), "nothing of the batch committed")

	res, err = f.in.ProcessBatch(ctx, "billing", []string{"m-2", "m-3"}, func(ctx context.Context, tx pgx.Tx, i int) error {
		return effectTx("billing", []string{"m-2", "m-3"}[i])(ctx, tx)
	})
	require.NoError(t, err)
	assert.Len(t, res, 2)
	assert.Equal(t, 1, f.effects(t, "billing", "m-3"))
}
