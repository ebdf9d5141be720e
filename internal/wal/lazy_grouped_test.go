package wal

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Once a commit has carried the records of several callers, lazy records
// are committed without waiting for company: under load the committer
// must go from one commit to the next (at 64 callers, leaving outcomes to
// wait for a Begin cost 0.095 syncs per request instead of 0.066). After
// a lone caller's commit they stay lazy. With the grouped case removed
// from append, the lazy record after a grouped commit waits for the hour
// and the test fails (checked).
func TestLogLazyIsNotLazyUnderConcurrency(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, &Options{LazyDelay: time.Hour}, (&collect{}).apply)
	require.NoError(t, err)
	defer l.Close()

	// A lone caller: one record per commit, then a lazy one waits.
	require.NoError(t, waitBatch(t, appendNoWait(t, l, "Balone")))
	lone := appendLazy(t, l, "Flone")
	select {
	case <-lone.Done():
		t.Fatal("a lone caller's lazy record was committed by itself")
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, waitBatch(t, appendNoWait(t, l, "Bnext")), "the next record takes it along")
	assert.True(t, isDone(lone))

	// Two callers in one commit: the committer is held off while both
	// append, as it is by the commit before under load.
	l.fileMu.Lock()
	a, b := appendNoWait(t, l, "Bone"), appendNoWait(t, l, "Btwo")
	require.Same(t, a, b, "one batch")
	l.fileMu.Unlock()
	require.NoError(t, waitBatch(t, a))
	require.NoError(t, waitBatch(t, appendLazy(t, l, "Fone")), "committed without company")
}

func isDone(b *Batch) bool {
	select {
	case <-b.Done():
		return true
	default:
		return false
	}
}
