package wal_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// The fsync-gate problem, one fault deeper than the truncation of a
// failed batch handles (internal/sim's TestKnownBugCacheOnly found it):
// a commit's sync fails (EIO: the disk, as Linux, drops the pages'
// durability for good, while reads still see them) and so does its
// truncation. The batch is then in the page cache only. The next process
// on the same machine must not build on it: a batch appended and synced
// after it would survive a power cut that it does not, and the hole
// before that acknowledged batch would make the log refuse to open.
//
// When the log can still write to the cache, it spoils the failed
// batch's header there, and the next open cuts it off as a torn tail: a
// commit reported failed does not come back. When it cannot, the next
// open finds the batch whole, and settles it: writes it again and syncs
// it before it appends anything, so that it is on disk as read.
//
// Checked to fail with settle's call removed from open ("spoiling fails
// too": the reopened log appends after the cached batch, and the log
// does not open after the power cut: ErrCorrupt), and with the spoiling
// write removed ("truncation fails": the failed commit comes back).
func TestSimCacheOnlyBatchIsNeverBuiltOn(t *testing.T) {
	tests := []struct {
		name      string
		opts      simdisk.Options
		spoilFail bool     // the write that spoils the batch's header fails too
		want      []string // what the log holds after the power cut
	}{
		{name: "truncation fails", want: []string{"a=1", "c=1"}},
		{name: "truncation fails, no O_DSYNC", opts: simdisk.Options{NoDSync: true}, want: []string{"a=1", "c=1"}},
		{name: "spoiling fails too", spoilFail: true, want: []string{"a=1", "b=1", "c=1"}},
		{name: "spoiling fails too, no O_DSYNC", opts: simdisk.Options{NoDSync: true}, spoilFail: true, want: []string{"a=1", "b=1", "c=1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := simdisk.New(&tt.opts)
			l, _, err := openSim(d)
			require.NoError(t, err)
			require.NoError(t, commit(l, []string{"a=1"}))

			synced := false // the failed batch's sync has failed
			d.SetFault(func(op simdisk.Op) error {
				switch {
				case op.Kind == simdisk.OpSync:
					synced = true
					return syscall.EIO
				case op.Kind == simdisk.OpTruncate:
					return syscall.EIO
				case op.Kind == simdisk.OpWrite && synced && tt.spoilFail:
					return syscall.EIO
				}
				return nil
			})
			assert.ErrorIs(t, commit(l, []string{"b=1"}), syscall.EIO, "the commit is reported failed")
			_ = l.Close()
			d.SetFault(nil)
			d.Kill() // the process exits; the machine, and its cache, stay

			l, got, err := openSim(d)
			require.NoError(t, err)
			if tt.spoilFail {
				assert.Equal(t, []string{"a=1", "b=1"}, got, "the failed batch, whole in the cache, reads back")
			} else {
				assert.Equal(t, []string{"a=1"}, got, "the failed commit does not come back")
			}
			require.NoError(t, commit(l, []string{"c=1"}), "acknowledged")
			_ = l.Close()

			d.Crash(nil) // the power cut: what is durable stays, nothing else
			l, got, err = openSim(d)
			require.NoError(t, err, "the log opens after the power cut")
			assert.Equal(t, tt.want, got, "every acknowledged commit is there")
			require.NoError(t, l.Close())
		})
	}
}

// A log that was not closed cleanly is settled when it is opened (its
// last batch written again and synced, the file and its directory), and
// one closed cleanly is not: the open of a clean file writes nothing.
// Checked to fail with settle run on every open (the clean open then
// writes).
func TestSimOpenSettlesOnlyAfterAnUncleanEnd(t *testing.T) {
	d := simdisk.New(nil)
	l, _, err := openSim(d)
	require.NoError(t, err)
	require.NoError(t, commit(l, []string{"a=1"}))
	require.NoError(t, l.Close())

	// writes opens the log, counts the writes and syncs of its open,
	// then commits record and dies without closing: no marker.
	writes := func(record string, want []string) int {
		n := 0
		d.SetFault(func(op simdisk.Op) error {
			if op.Kind == simdisk.OpWrite || op.Kind == simdisk.OpSync || op.Kind == simdisk.OpSyncDir {
				n++
			}
			return nil
		})
		l, got, err := openSim(d)
		require.NoError(t, err)
		d.SetFault(nil)
		assert.Equal(t, want, got)
		require.NoError(t, commit(l, []string{record}))
		d.Kill()
		_ = l.Close() // its process is dead: the marker goes nowhere
		return n
	}
	assert.Zero(t, writes("b=1", []string{"a=1"}), "a clean file opens without a write")
	assert.NotZero(t, writes("c=1", []string{"a=1", "b=1"}), "a file left unclosed is settled")
	assert.NotZero(t, writes("d=1", []string{"a=1", "b=1", "c=1"}), "and again")
}
