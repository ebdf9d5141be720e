package wal

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The log preallocates its file's tail: a commit that ends past it
// writes zeros after its batch, in the same write, so that the commits
// after it land on blocks already written and grow nothing. The file
// grows a few times, not at every commit; its size is past the log's
// end, with only zeros there; a clean close and an open keep the zeros
// (the file is clean, nothing is cut off or kept aside), and the next
// commit lands in them. Checked to fail with tailFor returning 0 (the
// file grows at every commit).
func TestLogPreallocatesItsTail(t *testing.T) {
	path := logPath(t)
	l := openLog(t, path, nil)
	sizes := map[int64]bool{}
	for i := range 200 {
		appendRecord(t, l, fmt.Sprintf("B%04d%s", i, bytes.Repeat([]byte("x"), 100)))
		fi, err := os.Stat(path)
		require.NoError(t, err)
		sizes[fi.Size()] = true
		require.GreaterOrEqual(t, fi.Size(), l.Size())
	}
	assert.Less(t, len(sizes), 40, "the file grows a tail at a time, not at every commit")
	end := l.Size()
	require.NoError(t, l.Close())

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Greater(t, int64(len(raw)), end+BatchHeaderLen+RecordHeaderLen+closeMarkerLen, "zeros after the marker")
	marked := end + BatchHeaderLen + RecordHeaderLen + closeMarkerLen
	assert.Empty(t, bytes.TrimLeft(raw[marked:], "\x00"), "only zeros after the last batch")

	var c collect
	l, err = Open(path, nil, c.apply)
	require.NoError(t, err)
	st := l.Stats()
	assert.True(t, st.Clean, "zeros after the marker are free space, not a torn tail")
	assert.Zero(t, st.Truncated)
	assert.Empty(t, st.TornPath)
	assert.Equal(t, marked, st.Size)
	assert.Len(t, c.payloads, 200)
	appendRecord(t, l, "Bafter")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, int64(len(raw)), fi.Size(), "the next commit lands in the zeros")
	require.NoError(t, l.Close())
}

// A tail grows with the file, a quarter of it up to 4 MiB, and ends on
// a 4 KiB boundary.
func TestTailFor(t *testing.T) {
	for _, end := range []int64{1, 100, 4096, 5000, 1 << 20, 100 << 20} {
		n := tailFor(end)
		assert.Zero(t, (end+n)%4096, "end %d", end)
		assert.GreaterOrEqual(t, n, min(end/4, 4<<20), "end %d", end)
		assert.LessOrEqual(t, n, int64(4<<20+4096), "end %d", end)
	}
}
