package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/inbox"
)

// migratedInbox is an inbox on a fresh SQLite file, migrated.
func migratedInbox(t *testing.T) *inbox.SQL {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	return in
}

// tombstone takes message id of consumer through a failed run to its
// tombstone (the dead letter about to be sent), as the message core does,
// and returns the tombstone's record.
func tombstone(t *testing.T, in *inbox.SQL, consumer, id string) inbox.Record {
	t.Helper()
	l, k := in.Ledger(consumer), inbox.Key{ID: id}
	var rec inbox.Record
	for _, op := range []inbox.Op{inbox.OpBegin, inbox.OpFailBegun, inbox.OpTombstone} {
		var err error
		rec, err = l.Apply(context.Background(), k, op)
		require.NoError(t, err)
	}
	return rec
}
