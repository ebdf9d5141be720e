package postgres_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// Issue 30 §4: the Inbox and Outbox tables the previous release wrote
// (testdata/baseline-inbox, made by commit 2d053bb: see
// inbox/inboxtest/testdata/baseline/README.md) are upgraded in place by
// Migrate and read by this release: every id recorded then is a duplicate
// whichever way it comes in (Process, ProcessBatch, Handle from a queue,
// the ledger), and the relay publishes the messages added then, with
// their ids. (With Migrate not adding the format column, every insert of
// this release failed; with Handle recording ids under the id space
// only, the old ids ran again: this test failed both ways.)
func TestInboxUpgrade(t *testing.T) {
	ctx := context.Background()
	s := newEmptySchema(t)
	pool := s.pool(t, 4)
	dump, err := os.ReadFile(filepath.Join("testdata", "baseline-inbox", "postgres.sql"))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, string(dump))
	require.NoError(t, err, "load the previous release's tables")
	raw, err := os.ReadFile(filepath.Join("testdata", "baseline-inbox", "manifest.json"))
	require.NoError(t, err)
	m := inboxtest.ReadManifest(t, raw)
	require.NoError(t, postgres.Migrate(ctx, pool), "upgrade in place")
	require.NoError(t, postgres.Migrate(ctx, pool), "again")

	in := postgres.NewInbox(pool)
	never := func(context.Context, pgx.Tx) error {
		t.Error("an id recorded before the upgrade ran again")
		return nil
	}
	for consumer := range m.Processed {
		ids := m.IDs(t, consumer)
		for _, id := range ids {
			res, err := in.Process(ctx, consumer, id, never)
			require.NoError(t, err)
			assert.True(t, res.Duplicate, "%s %q", consumer, id)
			for _, space := range []string{"orders", ""} {
				h := in.Handle(consumer, func(ctx context.Context, tx pgx.Tx, _ *inbox.Message) error { return never(ctx, tx) })
				require.NoError(t, h(ctx, &inbox.Message{ID: id, IDSpace: space}))
				rec, err := in.Ledger(consumer).Apply(ctx, inbox.Key{IDSpace: space, ID: id}, inbox.OpBegin)
				require.NoError(t, err)
				assert.True(t, rec.Processed, "%s %q in %q", consumer, id, space)
			}
		}
		res, err := in.ProcessBatch(ctx, consumer, ids, func(ctx context.Context, tx pgx.Tx, _ int) error { return never(ctx, tx) })
		require.NoError(t, err)
		for i, r := range res {
			assert.True(t, r.Duplicate, "%s %q", consumer, ids[i])
		}
	}
	ran := 0
	h := in.Handle("billing", func(context.Context, pgx.Tx, *inbox.Message) error { ran++; return nil })
	for _, space := range []string{"orders", "orders", "refunds"} {
		require.NoError(t, h(ctx, &inbox.Message{ID: "fresh-1", IDSpace: space}))
	}
	assert.Equal(t, 2, ran, "a new id runs once per id space")

	var relayed []postgres.OutboxMessage
	n, err := postgres.NewOutbox(pool).Relay(ctx, 10, func(_ context.Context, ms []postgres.OutboxMessage) error {
		relayed = append(relayed, ms...)
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	var got []string
	for _, om := range relayed {
		got = append(got, om.ID)
		assert.Equal(t, "orders", om.Topic)
		assert.Equal(t, []string{"t-1"}, om.Header["trace"])
	}
	assert.Equal(t, m.Outbox, got, "the messages added before the upgrade, with their ids")
}
