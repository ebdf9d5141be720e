package wal

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Close hands OnClose the checkpoint of its close marker, the file's
// last batch; an open whose Resume returns it applies only the records
// after it (none after a clean close, those appended since after a
// crash) and still reports the clean close; a checkpoint the file does
// not hold as named, or a load that fails, replays the whole file, and
// Salvage never asks. Checked to fail with the records after the
// checkpoint skipped, and with a failed load taken as done.
func TestLogResumesFromCheckpoint(t *testing.T) {
	path := logPath(t)
	var cps []Checkpoint
	onClose := func(cp Checkpoint) { cps = append(cps, cp) }
	l := openLog(t, path, &Options{OnClose: onClose})
	appendRecord(t, l, "a")
	appendRecord(t, l, "b")
	require.NoError(t, l.Close())
	require.Len(t, cps, 1)
	cp := cps[0]
	assert.Equal(t, int64(len(readUsed(t, path))), cp.End(), "the marker is the last batch")
	assert.Equal(t, uint64(3), cp.Seq)

	loads := 0
	resume := func(want Checkpoint, loadErr error) func(uint64) (Checkpoint, func() error, bool) {
		return func(salt uint64) (Checkpoint, func() error, bool) {
			assert.Equal(t, cp.Salt, salt)
			return want, func() error { loads++; return loadErr }, true
		}
	}
	open := func(opts *Options) (*Log, *collect) {
		var c collect
		l, err := Open(path, opts, c.apply)
		require.NoError(t, err)
		return l, &c
	}

	l, c := open(&Options{Resume: resume(cp, nil), OnClose: onClose})
	assert.Equal(t, 1, loads)
	assert.Empty(t, c.payloads)
	st := l.Stats()
	assert.True(t, st.Resumed)
	assert.True(t, st.Clean)
	assert.Equal(t, cp.End(), st.Size)
	appendRecord(t, l, "c")
	// A crash: a copy of the file as it is, without the next marker.
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	require.Len(t, cps, 2)
	assert.Equal(t, cp.Seq+2, cps[1].Seq, "a batch and the new marker")
	require.NoError(t, os.WriteFile(path, data, 0o600))

	l, c = open(&Options{Resume: resume(cp, nil)})
	assert.Equal(t, []string{"c"}, c.payloads)
	assert.True(t, l.Stats().Resumed)
	assert.False(t, l.Stats().Clean)
	appendRecord(t, l, "d") // the sequence goes on from the replayed batches
	require.NoError(t, l.Close())
	_, all := replayFile(t, path)
	assert.Equal(t, []string{"a", "b", "c", "d"}, all)

	for name, bad := range map[string]Checkpoint{
		"salt":         {Salt: cp.Salt + 1, Off: cp.Off, Len: cp.Len, Seq: cp.Seq, CRC: cp.CRC},
		"offset":       {Salt: cp.Salt, Off: cp.Off + 1, Len: cp.Len, Seq: cp.Seq, CRC: cp.CRC},
		"length":       {Salt: cp.Salt, Off: cp.Off, Len: cp.Len + 1, Seq: cp.Seq, CRC: cp.CRC},
		"seq":          {Salt: cp.Salt, Off: cp.Off, Len: cp.Len, Seq: cp.Seq + 1, CRC: cp.CRC},
		"CRC":          {Salt: cp.Salt, Off: cp.Off, Len: cp.Len, Seq: cp.Seq, CRC: cp.CRC + 1},
		"past the end": {Salt: cp.Salt, Off: 1 << 40, Len: cp.Len, Seq: cp.Seq, CRC: cp.CRC},
	} {
		loads = 0
		l, c = open(&Options{Resume: resume(bad, nil), ReadOnly: true})
		assert.Zero(t, loads, name)
		assert.Equal(t, []string{"a", "b", "c", "d"}, c.payloads, name)
		assert.False(t, l.Stats().Resumed, name)
		require.NoError(t, l.Close())
	}

	loads = 0
	l, c = open(&Options{Resume: resume(cp, errors.New("no")), ReadOnly: true})
	assert.Equal(t, 1, loads)
	assert.Equal(t, []string{"a", "b", "c", "d"}, c.payloads, "a failed load replays everything")
	assert.False(t, l.Stats().Resumed)
	require.NoError(t, l.Close())

	loads = 0
	l, c = open(&Options{Resume: resume(cp, nil), Salvage: true, ReadOnly: true})
	assert.Zero(t, loads)
	assert.Len(t, c.payloads, 4)
	require.NoError(t, l.Close())
}

// A read-only log, or one whose last write failed, never calls OnClose.
func TestLogOnCloseOnlyAfterTheMarker(t *testing.T) {
	path := logPath(t)
	called := 0
	l := openLog(t, path, nil)
	appendRecord(t, l, "a")
	require.NoError(t, l.Close())
	r, err := Open(path, &Options{ReadOnly: true, OnClose: func(Checkpoint) { called++ }}, func(int64, int, []byte) error { return nil })
	require.NoError(t, err)
	require.NoError(t, r.Close())
	assert.Zero(t, called)

	fail := func(step string) error {
		if step == "write" {
			return errors.New("disk gone")
		}
		return nil
	}
	l = openLog(t, path, &Options{Fault: fail, OnClose: func(Checkpoint) { called++ }})
	b := appendNoWait(t, l, "b")
	<-b.Done()
	require.Error(t, b.Err())
	require.Error(t, l.Close())
	assert.Zero(t, called)
}
