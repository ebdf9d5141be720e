package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
)

// A redelivered batch of more than 500 ids (batchTombstone reads them
// 500 at a time), whose tombstoned message is in the second chunk and
// appears twice, fails before anything runs, naming the message at its
// first place. Checked to fail with batchTombstone reading the first
// chunk only (the batch answered Duplicate for m-550 and was acked).
func TestAttack6TombstoneBeyondTheFirstChunk(t *testing.T) {
	ctx := context.Background()
	in := migratedInbox(t)
	tombstone(t, in, "billing", "m-550")
	var ids, others []string
	for i := range 600 {
		ids = append(ids, fmt.Sprintf("m-%d", i))
		if i != 550 {
			others = append(others, fmt.Sprintf("m-%d", i))
		}
	}
	_, err := in.ProcessBatch(ctx, "billing", others, func(context.Context, *sql.Tx, int) error { return nil })
	require.NoError(t, err)

	ran := 0
	res, err := in.ProcessBatch(ctx, "billing", append(ids, "m-550"), func(context.Context, *sql.Tx, int) error {
		ran++
		return nil
	})
	require.ErrorIs(t, err, inbox.ErrDeadLettered)
	assert.Contains(t, err.Error(), `message 550 of the batch ("m-550")`)
	assert.Nil(t, res)
	assert.Zero(t, ran)
}
