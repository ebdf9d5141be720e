package filejournal

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/wal"
)

// IDEMHTTP_JOURNAL_INDEX=always runs every test with an index file
// written at every clean close, whatever the journal's size, so that the
// tests that reopen a journal open it from its index file: CI runs the
// package's tests once more that way.
func init() {
	if os.Getenv("IDEMHTTP_JOURNAL_INDEX") == "always" {
		indexMin = 0
	}
}

// ijIndexAlways makes every clean close in the test write an index file,
// whatever the journal's size.
func ijIndexAlways(t *testing.T) { ijIndexMin(t, 0) }

// ijIndexMin sets indexMin for the test.
func ijIndexMin(t *testing.T, n int64) {
	saved := indexMin
	indexMin = n
	t.Cleanup(func() { indexMin = saved })
}

// ijIndexState is everything an open builds of a journal's index, as
// comparable values: the entries in order, with their places in the
// file, and the totals.
type ijIndexState struct {
	entries []entry
	live    int64
	high    int64 // Unix ns
	pending int
}

func ijStateOf(j *Journal) ijIndexState {
	j.mu.Lock()
	defer j.mu.Unlock()
	var st ijIndexState
	for _, le := range j.all {
		if le.gone {
			continue
		}
		v := ijIndexView(le)
		v.off, v.size = j.placeLocked(le)
		v.gen, v.slot, v.goneLate = 0, 0, false
		st.entries = append(st.entries, v)
	}
	st.live, st.high, st.pending = j.live, j.high.UnixNano(), j.pending
	return st
}

// ijIndexWorkload gives j entries of every kind: pending and done, with
// and without an operation id, finished, deleted, pruned, with (if
// compact) a compaction in the middle, so that entries are found through
// its remap, and entries begun after it.
func ijIndexWorkload(t *testing.T, j *Journal, rng *rand.Rand, prefix string, compact bool) {
	t.Helper()
	ctx := context.Background()
	begin := func(i int) {
		e := ijEntry(fmt.Sprintf("%s-%04d", prefix, i), "")
		if i%2 == 0 {
			e.Operation = fmt.Sprintf("%s-op-%04d", prefix, i)
		}
		e.Body = make([]byte, rng.IntN(300))
		e.Created = time.Now().Add(-time.Duration(rng.IntN(3600)) * time.Second)
		_, err := j.Begin(ctx, e)
		require.NoError(t, err)
	}
	finish := func(i int, st idemhttp.State) {
		key := fmt.Sprintf("%s-%04d", prefix, i)
		require.NoError(t, j.Finish(ctx, key, idemhttp.Outcome{State: st, Status: 200 + i%5, Attempts: 1 + i%3, At: time.Now()}))
	}
	for i := range 200 {
		begin(i)
	}
	for i := 0; i < 200; i += 3 {
		finish(i, idemhttp.StateDone)
	}
	for i := 1; i < 200; i += 7 {
		require.NoError(t, j.forceDelete(ctx, fmt.Sprintf("%s-%04d", prefix, i)))
	}
	_, err := j.Prune(ctx, time.Now().Add(time.Hour)) // every done entry
	require.NoError(t, err)
	if compact {
		require.NoError(t, j.Compact(ctx))
	}
	for i := 200; i < 300; i++ {
		begin(i)
	}
	for i := 202; i < 300; i += 5 {
		finish(i, idemhttp.StateDone)
	}
	finish(250, idemhttp.StateAbandoned)
	require.NoError(t, j.forceDelete(ctx, fmt.Sprintf("%s-%04d", prefix, 260)))
}

// ijCrashCopy copies the journal at path and its index file as they are
// now, as a crash at this instant would leave them, and returns the
// copy's path.
func ijCrashCopy(t *testing.T, path string) string {
	t.Helper()
	crashed := filepath.Join(t.TempDir(), "crashed")
	for _, suffix := range []string{"", indexSuffix} {
		data, err := os.ReadFile(path + suffix)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(crashed+suffix, data, 0o600))
	}
	return crashed
}

// ijReplayedState opens a copy of the journal at path without its index
// file, so that the open replays the whole file, and returns its index.
func ijReplayedState(t *testing.T, path string) ijIndexState {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	cp := filepath.Join(t.TempDir(), "replayed")
	require.NoError(t, os.WriteFile(cp, data, 0o600))
	j, err := Open(cp, &Options{ReadOnly: true})
	require.NoError(t, err)
	defer j.Close()
	require.False(t, j.Stats().IndexLoaded)
	return ijStateOf(j)
}

// The index file a clean close writes is the index a full replay builds:
// every entry with its fields and place in the file, in the same order,
// the live bytes, the pending count and the high-water mark. And a
// journal opened from it and then written, crashed (a byte copy of the
// file, no close marker after the index file's) and opened again builds
// from the index file and the batches after it what a full replay of
// the copy does. Checked to fail with the high-water mark or an entry's
// updated time left out of the file, and with the batches after the
// checkpoint not replayed.
func TestJournalIndexFileIsTheReplayedIndex(t *testing.T) {
	ijIndexAlways(t)
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	ijIndexWorkload(t, j, rand.New(rand.NewPCG(1, 2)), "a", true)
	want := ijStateOf(j)
	require.NoError(t, j.Close())
	require.FileExists(t, path+indexSuffix)

	j, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	st := j.Stats()
	assert.True(t, st.IndexLoaded)
	assert.True(t, st.CleanClose)
	got := ijStateOf(j)
	assert.Equal(t, want, got)
	assert.Equal(t, ijReplayedState(t, path), got)
	require.NoError(t, j.Verify(context.Background()))

	// Written after an open from the index file, then a crash.
	ijIndexWorkload(t, j, rand.New(rand.NewPCG(3, 4)), "b", false)
	require.NoError(t, j.Sync(context.Background()))
	crashed := ijCrashCopy(t, path)
	want = ijStateOf(j)
	require.NoError(t, j.Close())

	c, err := Open(crashed, &Options{ReadOnly: true})
	require.NoError(t, err)
	defer c.Close()
	st = c.Stats()
	assert.True(t, st.IndexLoaded, "the batches after the index file's close marker are replayed onto it")
	assert.False(t, st.CleanClose)
	got = ijStateOf(c)
	assert.Equal(t, ijReplayedState(t, crashed), got)
	assert.Equal(t, want, got)
	require.NoError(t, c.Verify(context.Background()))
}

// An index file is used only for the file it was written for: one from
// another journal, from before a compaction (the file has a new salt),
// damaged, cut short or with bytes after it, naming a batch the file
// does not hold as named, or one whose journal lost its tail (the close
// marker it names), is ignored, and the journal is replayed in full: its
// entries are those of the file. Checked to fail with each of the salt,
// the marker's CRC, length and sequence number, and a chunk's CRC not
// compared.
func TestJournalIndexFileRefusedWhenItDoesNotMatch(t *testing.T) {
	ijIndexAlways(t)
	ctx := context.Background()
	build := func(t *testing.T, prefix string) string {
		path := filepath.Join(t.TempDir(), "journal")
		j, err := Open(path, &Options{PruneInterval: -1})
		require.NoError(t, err)
		ijIndexWorkload(t, j, rand.New(rand.NewPCG(5, 6)), prefix, true)
		require.NoError(t, j.Close())
		return path
	}
	check := func(t *testing.T, path string) {
		t.Helper()
		want := ijReplayedState(t, path)
		j, err := Open(path, &Options{ReadOnly: true})
		require.NoError(t, err)
		defer j.Close()
		assert.False(t, j.Stats().IndexLoaded, "index file used")
		assert.Equal(t, want, ijStateOf(j))
	}
	edit := func(t *testing.T, path string, fn func([]byte) []byte) {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, fn(usedBytes(t, b)), 0o600))
	}
	t.Run("another journal's", func(t *testing.T) {
		a, b := build(t, "a"), build(t, "b")
		idx, err := os.ReadFile(b + indexSuffix)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(a+indexSuffix, idx, 0o600))
		check(t, a)
	})
	t.Run("before a compaction", func(t *testing.T) {
		path := build(t, "a")
		idx, err := os.ReadFile(path + indexSuffix)
		require.NoError(t, err)
		j, err := Open(path, &Options{PruneInterval: -1})
		require.NoError(t, err)
		require.NoError(t, j.Compact(ctx))
		require.NoError(t, j.Close())
		require.NoError(t, os.WriteFile(path+indexSuffix, idx, 0o600))
		check(t, path)
	})
	t.Run("the same journal, its marker cut off", func(t *testing.T) {
		path := build(t, "a")
		edit(t, path, func(b []byte) []byte { return b[:len(b)-1] })
		check(t, path)
	})
	t.Run("the same journal, its marker replaced", func(t *testing.T) {
		// The marker cut off, and another batch written where it was,
		// as a writer would after losing it: same salt, offset and
		// sequence number, other records.
		path := build(t, "a")
		idx, err := os.ReadFile(path + indexSuffix)
		require.NoError(t, err)
		x := openFjIndex(wal.OS{}, path+indexSuffix)
		require.NotNil(t, x)
		x.close()
		edit(t, path, func(b []byte) []byte {
			require.Equal(t, int64(len(b)), x.cp.End())
			return b[:x.cp.Off]
		})
		j, err := Open(path, &Options{PruneInterval: -1})
		require.NoError(t, err)
		_, err = j.Begin(ctx, ijEntry("after", ""))
		require.NoError(t, err)
		require.NoError(t, j.Close())
		require.NoError(t, os.WriteFile(path+indexSuffix, idx, 0o600))
		check(t, path)
	})
	for _, tt := range []struct {
		name string
		fn   func([]byte) []byte
	}{
		{"a byte flipped in an entry", func(b []byte) []byte { b[len(b)/2] ^= 1; return b }},
		{"a byte flipped in an entry's time", func(b []byte) []byte { b[indexHeaderLen+indexChunkHdr+8] ^= 1; return b }},
		{"a byte flipped in the header", func(b []byte) []byte { b[30] ^= 1; return b }},
		{"cut short", func(b []byte) []byte { return b[:len(b)-10] }},
		{"bytes after it", func(b []byte) []byte { return append(b, 0) }},
		{"empty", func([]byte) []byte { return nil }},
		// The header's own CRC made right again: what is refused is the
		// field.
		{"another version", ijIndexHeaderEdit(8, 4)},
		{"another salt", ijIndexHeaderEdit(16, 8)},
		{"another marker offset", ijIndexHeaderEdit(24, 8)},
		{"another marker length", ijIndexHeaderEdit(32, 4)},
		{"another marker CRC", ijIndexHeaderEdit(36, 4)},
		{"another marker sequence number", ijIndexHeaderEdit(40, 8)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := build(t, "a")
			edit(t, path+indexSuffix, tt.fn)
			check(t, path)
		})
	}
}

// ijIndexHeaderEdit returns an edit of an index file that adds 1 to the
// header field of n bytes at off, and seals the header again.
func ijIndexHeaderEdit(off, n int) func([]byte) []byte {
	return func(b []byte) []byte {
		if n == 4 {
			binary.LittleEndian.PutUint32(b[off:], binary.LittleEndian.Uint32(b[off:])+1)
		} else {
			binary.LittleEndian.PutUint64(b[off:], binary.LittleEndian.Uint64(b[off:])+1)
		}
		binary.LittleEndian.PutUint32(b[68:], wal.Checksum(b[:68]))
		return b
	}
}

// After a clean close, an old entry's damaged body is not read by the
// open (the index file stands for the records), but it is found: reading
// the entry back fails with ErrCorrupt, and so does Verify, which
// still replays the whole file. Without the index file, the open refuses
// the file, as it always did.
func TestJournalIndexFileDamageStillFound(t *testing.T) {
	ijIndexAlways(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	e := ijEntry("damaged", "")
	e.Body = []byte(strings.Repeat("x", 64))
	_, err = j.Begin(ctx, e)
	require.NoError(t, err)
	for i := range 20 {
		_, err = j.Begin(ctx, ijEntry(fmt.Sprintf("k-%d", i), ""))
		require.NoError(t, err)
	}
	require.NoError(t, j.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	i := strings.Index(string(b), strings.Repeat("x", 64))
	require.Positive(t, i)
	b[i+10] = 'y'
	require.NoError(t, os.WriteFile(path, b, 0o600))

	j, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	assert.True(t, j.Stats().IndexLoaded)
	_, err = j.Get(ctx, "damaged")
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorIs(t, j.Verify(ctx), ErrCorrupt)
	require.NoError(t, j.Close())

	require.NoError(t, os.Remove(path+indexSuffix))
	_, err = Open(path, &Options{PruneInterval: -1})
	require.ErrorIs(t, err, ErrCorrupt)
}

// A small journal gets no index file, and a clean close removes the one
// it had when it grew small; a read-only open writes none.
func TestJournalIndexFileOnlyForLargeJournals(t *testing.T) {
	ijIndexMin(t, 8<<20)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	_, err = j.Begin(ctx, ijEntry("k", ""))
	require.NoError(t, err)
	require.NoError(t, j.Close())
	assert.NoFileExists(t, path+indexSuffix)

	indexMin = 0
	r, err := Open(path, &Options{ReadOnly: true})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	assert.NoFileExists(t, path+indexSuffix, "a read-only open wrote one")

	j, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.FileExists(t, path+indexSuffix)
	info, err := os.Stat(path + indexSuffix)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	indexMin = 1 << 40
	j, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	assert.True(t, j.Stats().IndexLoaded)
	require.NoError(t, j.Close())
	assert.NoFileExists(t, path+indexSuffix)
	left, err := filepath.Glob(path + indexSuffix + "*")
	require.NoError(t, err)
	assert.Empty(t, left)

	// After SkipVerify, the file may hold damage the index file would
	// hide from the next open: a clean close writes none, and removes
	// the one there was.
	indexMin = 0
	j, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.FileExists(t, path+indexSuffix)
	j, err = Open(path, &Options{PruneInterval: -1, SkipVerify: true})
	require.NoError(t, err)
	assert.False(t, j.Stats().IndexLoaded)
	require.NoError(t, j.Close())
	assert.NoFileExists(t, path+indexSuffix)
}

// The index file's entries are checked as replay checks a begin record,
// whatever their chunk's CRC says: FuzzJournalIndexChunk's inputs are
// chunk payloads, sealed with a valid CRC into an index file for a real
// journal, and the open must never fail or panic for them, and must use
// one only if every entry in it could be in the file.
func FuzzJournalIndexChunk(f *testing.F) {
	dir := f.TempDir()
	base := filepath.Join(dir, "journal")
	saved := indexMin
	indexMin = 0
	j, err := Open(base, &Options{PruneInterval: -1})
	require.NoError(f, err)
	for i := range 3 {
		e := ijEntry(fmt.Sprintf("k-%d", i), "")
		if i == 1 {
			e.Operation = "op-1"
		}
		_, err := j.Begin(context.Background(), e)
		require.NoError(f, err)
	}
	require.NoError(f, j.Close())
	indexMin = saved
	journal, err := os.ReadFile(base)
	require.NoError(f, err)
	index, err := os.ReadFile(base + indexSuffix)
	require.NoError(f, err)
	hdr := index[:indexHeaderLen]
	f.Add(index[indexHeaderLen+indexChunkHdr:], uint8(3))
	f.Fuzz(func(t *testing.T, payload []byte, n uint8) {
		if n == 0 {
			n = 1
		}
		path := filepath.Join(t.TempDir(), "journal")
		require.NoError(t, os.WriteFile(path, journal, 0o600))
		h := slices.Clone(hdr)
		binary.LittleEndian.PutUint32(h[12:], 1)
		binary.LittleEndian.PutUint64(h[56:], uint64(n))
		binary.LittleEndian.PutUint32(h[indexHeaderLen-4:], wal.Checksum(h[:indexHeaderLen-4]))
		file := binary.LittleEndian.AppendUint32(h, uint32(len(payload)))
		file = binary.LittleEndian.AppendUint32(file, uint32(n))
		file = binary.LittleEndian.AppendUint32(file, wal.Checksum(payload))
		require.NoError(t, os.WriteFile(path+indexSuffix, append(file, payload...), 0o600))

		j, err := Open(path, &Options{ReadOnly: true})
		require.NoError(t, err, "an index file made the open fail")
		defer j.Close()
		if !j.Stats().IndexLoaded {
			return
		}
		x := openFjIndex(wal.OS{}, path+indexSuffix)
		require.NotNil(t, x)
		x.close()
		j.mu.Lock()
		defer j.mu.Unlock()
		assert.Equal(t, int(n), j.byKey.len())
		for _, le := range j.all {
			assert.NoError(t, contract.ValidateKey(le.key()))
			assert.GreaterOrEqual(t, le.off, int64(wal.FileHeaderLen))
			assert.LessOrEqual(t, le.off+int64(le.size), x.cp.End())
			assert.Same(t, le, j.byKey.get(le.key()))
			if op := le.operation(); op != "" {
				assert.Same(t, le, j.byOp.get(op))
			}
		}
	})
}

// A record of the digest's kind in a file is an unknown record, as
// Verify says, not a begin record in short: replay digests begin
// records itself, and a digest it did not make must not pass for one.
// Checked to fail with digest passing such a record through.
func TestJournalRefusesADigestInTheFile(t *testing.T) {
	d, err := digest(nil, ijBegin(t, ijEntry("k", ""))[wal.RecordHeaderLen:])
	require.NoError(t, err)
	file := ijFile(ijBatch(1, appendRecord(nil, d)))
	_, err = replay(file, false)
	require.ErrorIs(t, err, ErrCorrupt)
	ijCheckReplay(t, file, false)
	ijCheckReplay(t, file, true)
}

// ijWriteIndexFile writes the index file to, for the checkpoint cp,
// from what a read-only open of the journal at from indexes: each live
// entry as edit leaves it (edit returning false leaves it out), with
// the high-water mark high (the journal's, if zero). It returns how many
// entries it wrote.
func ijWriteIndexFile(t *testing.T, from, to string, cp wal.Checkpoint, edit func(*entry) bool, high time.Time) int {
	t.Helper()
	r, err := Open(from, &Options{ReadOnly: true})
	require.NoError(t, err)
	defer r.Close()
	w, err := newFjIndexWriter(wal.OS{}, to, new(atomic.Uint64), false)
	require.NoError(t, err)
	r.mu.Lock()
	added := 0
	for _, le := range r.all {
		if v := *le; !le.gone && edit(&v) {
			w.add(&v, le.off, le.size)
			added++
		}
	}
	if high.IsZero() {
		high = r.high
	}
	r.mu.Unlock()
	require.NoError(t, w.finish(cp, high, &clockState{}))
	return added
}

// An index file that loads but that the batches after it do not apply
// to (here, one that lacks an entry a later batch deletes) is not what
// the journal says: the open replays the whole journal instead, and
// succeeds. Checked to fail (the open refuses the journal as corrupt)
// without the second replay.
func TestJournalIndexFileThatTheTailContradicts(t *testing.T) {
	ijIndexAlways(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	for i := range 10 {
		_, err := j.Begin(ctx, ijEntry(fmt.Sprintf("k-%d", i), ""))
		require.NoError(t, err)
	}
	require.NoError(t, j.Close())
	x := openFjIndex(wal.OS{}, path+indexSuffix)
	require.NotNil(t, x)
	x.close()

	j, err = Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	require.True(t, j.Stats().IndexLoaded)
	require.NoError(t, j.forceDelete(ctx, "k-3"))
	crashed := ijCrashCopy(t, path)
	require.NoError(t, j.Close())

	// The copy's index file, for the same checkpoint, without k-3.
	added := ijWriteIndexFile(t, path, crashed+indexSuffix, x.cp, func(*entry) bool { return true }, time.Now())
	require.Equal(t, 9, added)

	c, err := Open(crashed, &Options{PruneInterval: -1})
	require.NoError(t, err)
	assert.False(t, c.Stats().IndexLoaded)
	assert.Equal(t, ijReplayedState(t, crashed), ijStateOf(c))
	_, err = c.Get(ctx, "k-3")
	require.ErrorIs(t, err, idemhttp.ErrNotFound)
	require.NoError(t, c.Close())
}

// Verify of a read-only journal compares everything the index holds of
// each entry with what a replay of the file builds, not just where the
// entry is: an index file whose CRCs hold but whose entry says done
// where the file says pending is found, as is one with another
// high-water mark. Checked to fail with Verify comparing places only.
func TestJournalVerifyFindsAnIndexFileThatLies(t *testing.T) {
	ijIndexAlways(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, &Options{PruneInterval: -1})
	require.NoError(t, err)
	for i := range 5 {
		_, err := j.Begin(ctx, ijEntry(fmt.Sprintf("k-%d", i), ""))
		require.NoError(t, err)
	}
	require.NoError(t, j.Close())
	x := openFjIndex(wal.OS{}, path+indexSuffix)
	require.NotNil(t, x)
	x.close()
	lie := func(t *testing.T, edit func(le *entry), high time.Time) {
		ijWriteIndexFile(t, path, path+indexSuffix, x.cp, func(le *entry) bool { edit(le); return true }, high)

		v, err := Open(path, &Options{ReadOnly: true})
		require.NoError(t, err)
		defer v.Close()
		require.True(t, v.Stats().IndexLoaded)
		require.ErrorIs(t, v.Verify(ctx), ErrCorrupt)
	}
	t.Run("state", func(t *testing.T) {
		lie(t, func(le *entry) {
			if le.key() == "k-2" {
				le.state = journalStateDone
			}
		}, time.Time{})
	})
	t.Run("high-water mark", func(t *testing.T) {
		lie(t, func(*entry) {}, time.Now().Add(time.Hour))
	})
}
