package filejournal

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJournalCompactSwitchesWithoutTouchingEveryEntry drives a compaction
// through the two moments its cheap switch depends on, with the journal
// working at each:
//   - after the first chunk of its snapshot, entries of later chunks are
//     deleted (they must still be written to the new file, since their
//     delete records are copied after them), finished and begun;
//   - after the switch, before the fix-up pass has brought the old
//     entries to their new places, entries are read (Get, Pending,
//     Verify: through remap), deleted, finished and begun.
//
// Then the journal must agree with a model, with Verify, and with itself
// reopened, down to the live-bytes estimate. With the goneLate mark
// ignored in the snapshot the reopen finds a deletion of an unknown key;
// with placeLocked ignoring remap, the reads after the switch fail; with
// the fix-up's live-bytes adjustment removed the estimates differ
// (checked all three).
//
// The compaction also writes the new file's index file, as of the last
// batch of the records it rewrote: a crash after it (a copy of the file
// and the index file before the close) opens from the index file and the
// batches after it (those committed during the compaction and after),
// and builds what a full replay of the copy does. Checked to fail with
// the entries deleted since the snapshot (rewritten, then deleted by a
// batch copied after) left out of the index file.
func TestJournalCompactSwitchesWithoutTouchingEveryEntry(t *testing.T) {
	if !wal.CanRewrite {
		t.Skip("no compaction on this platform")
	}
	ijIndexAlways(t)
	ctx := context.Background()
	j, path := ijOpen(t, nil)
	n := 3*removeChunk + 100
	model := map[string]idemhttp.State{}
	key := func(i int) string { return fmt.Sprintf("k-%05d", i) }
	// Concurrently, so that group commit makes this quick.
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 32 {
				_, err := j.Begin(ctx, ijEntry(key(i), "op-"+key(i)))
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range n {
		model[key(i)] = idemhttp.StatePending
	}
	finish := func(k string) {
		t.Helper()
		require.NoError(t, j.Finish(ctx, k, idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1, At: ijT0.Add(time.Hour)}))
		model[k] = idemhttp.StateDone
	}
	del := func(k string) {
		t.Helper()
		require.NoError(t, j.forceDelete(ctx, k))
		delete(model, k)
	}
	begin := func(k string) {
		t.Helper()
		_, err := j.Begin(ctx, ijEntry(k, "op-"+k))
		require.NoError(t, err)
		model[k] = idemhttp.StatePending
	}
	for i := 0; i < n; i += 3 {
		finish(key(i))
	}

	var hooked []string
	j.hook = func(point string) {
		hooked = append(hooked, point)
		switch point {
		case "snapshot":
			for i := n - 20; i < n; i += 2 {
				del(key(i))
			}
			finish(key(n - 1))
			for i := range 5 {
				begin(fmt.Sprintf("snap-%d", i))
			}
		case "switched":
			j.mu.Lock()
			behind := 0
			for le := range j.byKey.all() {
				if le.gen != j.gen {
					behind++
				}
			}
			j.mu.Unlock()
			assert.Greater(t, behind, n/2, "the switch leaves the old entries to the fix-up")
			for _, i := range []int{0, 1, removeChunk + 7, n - 21, n - 1} {
				e, err := j.Get(ctx, key(i))
				require.NoError(t, err, key(i))
				assert.Equal(t, model[key(i)], e.State, key(i))
				assert.Equal(t, `{"amount":100}`, string(e.Body), key(i))
			}
			pending, err := j.Pending(ctx)
			require.NoError(t, err)
			want := 0
			for _, st := range model {
				if st == idemhttp.StatePending {
					want++
				}
			}
			assert.Len(t, pending, want)
			require.NoError(t, j.Verify(ctx))
			for i := 100; i < 110; i++ {
				del(key(i))
			}
			finish(key(2))
			for i := range 5 {
				begin(fmt.Sprintf("switched-%d", i))
			}
		}
	}
	require.NoError(t, j.Compact(ctx))
	j.hook = nil
	assert.Equal(t, []string{"snapshot", "switched"}, hooked)
	require.NoError(t, j.Verify(ctx))
	begin("after")

	check := func(j *Journal) {
		t.Helper()
		all, err := j.Entries(ctx)
		require.NoError(t, err)
		got := map[string]idemhttp.State{}
		for _, e := range all {
			got[e.Key] = e.State
		}
		assert.Equal(t, model, got)
	}
	check(j)
	require.NoError(t, j.Sync(ctx))
	crashed := ijCrashCopy(t, path)
	c, err := Open(crashed, &Options{ReadOnly: true})
	require.NoError(t, err)
	assert.True(t, c.Stats().IndexLoaded, "the compaction's index file")
	check(c)
	assert.Equal(t, ijReplayedState(t, crashed), ijStateOf(c))
	require.NoError(t, c.Verify(ctx))
	require.NoError(t, c.Close())
	live := j.Stats().LiveBytes
	require.NoError(t, j.Close())
	r := ijReopen(t, path)
	check(r)
	require.NoError(t, r.Verify(ctx))
	assert.Equal(t, r.Stats().LiveBytes, live, "the index's estimate of the live bytes, kept through the fix-up")
}
