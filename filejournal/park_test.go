package filejournal

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// retryAfter answers 429 asking the client to come back in secs seconds.
func retryAfter(secs string) step {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", secs)
		w.WriteHeader(http.StatusTooManyRequests)
	}
}

// Issue 34 §4: a parked operation's not-before is durable. A Client parks
// an operation the server asked to come back for in an hour; the process
// ends; a new process's Resume, over the reopened journal, sends nothing
// before that time and the entry once after it, under its key. Checked to
// fail with Finish writing a plain finish record for a park (the reopened
// entry had no not-before, and Resume sent it at once), and with replay
// ignoring parked records (corruption: an unknown kind).
func TestParkedOperationSurvivesARestart(t *testing.T) {
	ctx := idemhttp.WithOperation(context.Background(), "export-7")
	srv := newScripted(t, retryAfter("3600"), reply(201, `{"id":"ex_7"}`))
	clock := &ijClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	path := filepath.Join(t.TempDir(), "journal")
	opts := &Options{Clock: clock.now, PruneInterval: -1}
	j, err := Open(path, opts)
	require.NoError(t, err)
	_, err = (&idemhttp.Client{Journal: j, Policy: fast()}).Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	var parked *idemhttp.ParkedError
	require.ErrorAs(t, err, &parked)
	wantNB := clock.now().Add(time.Hour)
	assert.Equal(t, wantNB, parked.NotBefore)
	require.NoError(t, j.Close()) // the process ends

	resume := func() []idemhttp.ResumeResult {
		t.Helper()
		j, err := Open(path, opts)
		require.NoError(t, err)
		defer func() { require.NoError(t, j.Close()) }()
		pending, err := j.Pending(context.Background())
		require.NoError(t, err)
		require.Len(t, pending, 1)
		assert.True(t, wantNB.Equal(pending[0].NotBefore), "Pending shows the time: %v", pending[0].NotBefore)
		rs, err := (&idemhttp.Client{Journal: j, Policy: fast()}).Resume(context.Background(), nil)
		require.NoError(t, err)
		return rs
	}
	clock.set(wantNB.Add(-time.Second))
	rs := resume()
	require.Len(t, rs, 1)
	assert.ErrorIs(t, rs[0].Err, idemhttp.ErrParked)
	assert.Len(t, srv.Hits(), 1, "nothing sent before the server's time")

	clock.set(wantNB)
	rs = resume()
	require.Len(t, rs, 1)
	require.NoError(t, rs[0].Err)
	hits := srv.Hits()
	require.Len(t, hits, 2)
	assert.Equal(t, hits[0].Key, hits[1].Key, "under its key")
}

// A parked entry's not-before is in the file: it survives a crash copy
// (replayed), a compaction, and a reopen from the index file,
// and Verify finds nothing wrong; a later outcome ends it, on disk too.
// Checked to fail with readEntry keeping a parked record's time after a
// finish record (the resend's pending outcome still showed the park).
func TestFileJournalKeepsParked(t *testing.T) {
	ijIndexAlways(t) // the reopen reads the index file a clean close writes
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	opts := &Options{PruneInterval: -1}
	j, err := Open(path, opts)
	require.NoError(t, err)
	nb := time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC)
	for _, k := range []string{"parked", "enqueued", "plain", "ended"} {
		e := ijEntry(k, "op-"+k)
		if k == "enqueued" {
			e.NotBefore = nb.Add(time.Hour) // a producer's: send after then
		}
		_, err := j.Begin(ctx, e)
		require.NoError(t, err)
	}
	require.NoError(t, j.Finish(ctx, "parked", idemhttp.Outcome{State: idemhttp.StatePending, Status: 429, Attempts: 1, NotBefore: nb}))
	require.NoError(t, j.Finish(ctx, "ended", idemhttp.Outcome{State: idemhttp.StatePending, Status: 429, Attempts: 1, NotBefore: nb}))
	require.NoError(t, j.Finish(ctx, "ended", idemhttp.Outcome{State: idemhttp.StatePending, Status: 503, Attempts: 1}))
	check := func(t *testing.T, j *Journal, what string) {
		t.Helper()
		want := map[string]time.Time{"parked": nb, "enqueued": nb.Add(time.Hour)}
		pending, err := j.Pending(ctx)
		require.NoError(t, err, what)
		require.Len(t, pending, 4, what)
		for _, e := range pending {
			assert.True(t, want[e.Key].Equal(e.NotBefore), "%s: %s not before %v", what, e.Key, e.NotBefore)
			assert.Equal(t, []byte(`{"amount":100}`), e.Body, "%s: the request is still there", what)
		}
		got, err := j.Get(ctx, "parked")
		require.NoError(t, err, what)
		assert.Equal(t, 429, got.LastStatus, what)
		assert.Equal(t, 1, got.Attempts, what)
		got, err = j.Get(ctx, "ended")
		require.NoError(t, err, what)
		assert.Equal(t, 503, got.LastStatus, what)
		assert.True(t, got.NotBefore.IsZero(), "%s: a later outcome ended the park", what)
		require.NoError(t, j.Verify(ctx), what)
	}
	check(t, j, "live")
	require.NoError(t, j.Sync(ctx))
	crash := filepath.Join(t.TempDir(), "crash")
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(crash, raw, 0o600))
	c, err := Open(crash, opts)
	require.NoError(t, err)
	check(t, c, "crash copy")
	require.NoError(t, c.Close())
	if wal.CanRewrite {
		require.NoError(t, j.Compact(ctx))
		check(t, j, "compacted")
	}
	require.NoError(t, j.Close())
	r, err := Open(path, opts)
	require.NoError(t, err)
	assert.True(t, r.Stats().IndexLoaded, "opened from the index file")
	check(t, r, "reopened")

	// Done ends the park for good.
	require.NoError(t, r.Finish(ctx, "parked", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))
	got, err := r.Get(ctx, "parked")
	require.NoError(t, err)
	assert.True(t, got.NotBefore.IsZero())
	require.NoError(t, r.Close())
}
