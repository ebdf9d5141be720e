package filejournal

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ijHighWater returns j's mark, failing the test on an error.
func ijHighWater(t *testing.T, j *Journal) time.Time {
	t.Helper()
	mark, err := j.HighWater(context.Background())
	require.NoError(t, err)
	return mark
}

// ijBeginAt stores a pending entry for key created at created.
func ijBeginAt(t *testing.T, j *Journal, key string, created time.Time) {
	t.Helper()
	e := ijEntry(key, "op-"+key)
	e.Created, e.Updated = created, created
	existing, err := j.Begin(context.Background(), e)
	require.NoError(t, err)
	require.Nil(t, existing)
}

// The mark is the latest time any record held, and it outlives the
// records: reopening replays it, deleting or pruning the newest entry
// keeps it, and compaction, which drops those entries' records, carries
// it in a clock record. Checked to fail: with fill's clock record
// holding an earlier time, "compact" and "prune and compact" reopen
// with the mark at t1, the pending entry's time. (Replay not raising the
// mark for begin records is caught by TestJournalHighWaterReplay and
// FuzzReplay's seeds; here the finish record carries t3.)
func TestJournalHighWaterSurvives(t *testing.T) {
	// Ahead of the clock, so that the time Prune and Delete record (see
	// TestJournalPruneAndDeleteRecordTheirTime) leaves the mark at t3.
	t1 := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	t2 := t1.Add(25 * time.Hour)
	t3 := t2.Add(time.Second) // when the newer entry got its outcome
	tests := []struct {
		name  string
		after func(t *testing.T, j *Journal)
	}{
		{name: "reopen", after: func(*testing.T, *Journal) {}},
		{name: "delete", after: func(t *testing.T, j *Journal) {
			require.NoError(t, j.forceDelete(context.Background(), "new"))
		}},
		{name: "prune", after: func(t *testing.T, j *Journal) {
			n, err := j.Prune(context.Background(), t3.Add(time.Hour))
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}},
		{name: "compact", after: func(t *testing.T, j *Journal) {
			require.NoError(t, j.forceDelete(context.Background(), "new"))
			require.NoError(t, j.Compact(context.Background()))
		}},
		{name: "prune and compact", after: func(t *testing.T, j *Journal) {
			_, err := j.Prune(context.Background(), t3.Add(time.Hour))
			require.NoError(t, err)
			require.NoError(t, j.Compact(context.Background()))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "journal")
			j, err := Open(path, &Options{PruneInterval: -1})
			require.NoError(t, err)
			assert.True(t, ijHighWater(t, j).IsZero(), "a new journal has no mark")
			ijBeginAt(t, j, "old", t1)
			ijBeginAt(t, j, "new", t2)
			require.NoError(t, j.Finish(ctx, "new", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: t3}))
			assert.Equal(t, t3, ijHighWater(t, j), "Finish raises the mark")
			tt.after(t, j)
			assert.Equal(t, t3, ijHighWater(t, j), "before the reopen")
			require.NoError(t, j.Close())
			_, err = j.HighWater(ctx)
			assert.ErrorIs(t, err, ErrClosed)

			j = ijReopen(t, path)
			assert.Equal(t, t3, ijHighWater(t, j), "after the reopen")
			require.NoError(t, j.Verify(ctx))
			ro, err := Open(path, &Options{ReadOnly: true})
			require.NoError(t, err)
			defer ro.Close()
			assert.Equal(t, t3, ijHighWater(t, ro), "read-only")
		})
	}
}

// Prune and Delete record when they ran: the entries they drop may have
// held the latest times, and a clock set forward, then back while only
// pruning ran, went unnoticed without it (an entry really 25 h old then
// looks 23 h old). The mark is at least the time each one ran, also
// after a reopen. Without the clock record in their batches, it stays at
// the entries' times (checked).
func TestJournalPruneAndDeleteRecordTheirTime(t *testing.T) {
	ctx := context.Background()
	for _, op := range []string{"prune", "delete"} {
		t.Run(op, func(t *testing.T) {
			j, path := ijOpen(t, nil)
			ijBeginAt(t, j, "old", ijT0)
			require.NoError(t, j.Finish(ctx, "old", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: ijT0}))
			require.Equal(t, ijT0, ijHighWater(t, j))
			before := time.Now().Round(0)
			if op == "prune" {
				n, err := j.Prune(ctx, ijT0.Add(time.Hour))
				require.NoError(t, err)
				require.Equal(t, 1, n)
			} else {
				require.NoError(t, j.forceDelete(ctx, "old"))
			}
			assert.False(t, ijHighWater(t, j).Before(before.Truncate(time.Second)), "the time it ran")
			require.NoError(t, j.Close())
			r := ijReopen(t, path)
			assert.False(t, ijHighWater(t, r).Before(before.Truncate(time.Second)), "after a reopen")
			require.NoError(t, r.Verify(ctx))
		})
	}
}

// Compaction writes the mark as the first record of the new file, in the
// clock record's encoding; a second compaction keeps it.
func TestJournalCompactWritesTheMarkFirst(t *testing.T) {
	ctx := context.Background()
	j, path := ijOpen(t, nil)
	// Ahead of the clock, as in TestJournalHighWaterSurvives.
	t1 := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
	t2 := t1.Add(time.Hour)
	ijBeginAt(t, j, "a", t1)
	ijBeginAt(t, j, "b", t2)
	require.NoError(t, j.Delete(ctx, "b"))
	for range 2 {
		require.NoError(t, j.Compact(ctx))
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		payload, _, ok := readRecord(raw[fileHdrLen+batchHdrLen:])
		require.True(t, ok)
		rec, err := decodeRecord(payload)
		require.NoError(t, err)
		assert.Equal(t, &record{kind: kindClock, updated: t2}, rec)
		assert.Equal(t, t2, ijHighWater(t, j))
	}
}

// A file without a clock record (written by an older build, or never
// compacted) opens, and its mark is the latest time its records hold,
// deleted entries' included. A clock record anywhere counts, even one
// holding a time later than every entry.
func TestJournalHighWaterReplay(t *testing.T) {
	t1, t2, t3 := ijT0, ijT0.Add(time.Hour), ijT0.Add(2*time.Hour)
	a, b := ijBegin(t, ijEntry("a", "op-a")), ijEntry("b", "op-b")
	b.Created, b.Updated = t1, t2
	tests := []struct {
		name string
		give []byte
		want time.Time
	}{
		{name: "empty", give: ijFile(), want: time.Time{}},
		{name: "begins only", give: ijFile(ijBatch(1, a, ijBegin(t, b))), want: t2},
		{
			name: "finish of a deleted entry",
			give: ijFile(ijBatch(1, a, ijBegin(t, b)), ijBatch(2, appendFinish(nil, "b", journalStateDone, 200, 1, t3), appendDelete(nil, "b"))),
			want: t3,
		},
		{name: "clock record first", give: ijFile(ijBatch(1, appendClock(nil, t3), a)), want: t3},
		{name: "clock record older than the entries", give: ijFile(ijBatch(1, appendClock(nil, t1), ijBegin(t, b))), want: t2},
		{name: "clock record alone", give: ijFile(ijBatch(1, appendClock(nil, t3))), want: t3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal")
			require.NoError(t, os.WriteFile(path, tt.give, 0o600))
			j := ijReopen(t, path)
			assert.Equal(t, tt.want, ijHighWater(t, j))
			require.NoError(t, j.Verify(context.Background()))

			idx, err := replay(tt.give, false)
			require.NoError(t, err)
			assert.Equal(t, tt.want, idx.high, "the fast replay")
			full, err := replayWith(tt.give, false, (*index).verifyRecord)
			require.NoError(t, err)
			assert.Equal(t, tt.want, full.high, "the full replay")
		})
	}
}

// The end to end hole that the mark closes: a pending entry 25 h old, a
// newer entry done and pruned, the clock set back 2 h, so that the
// pending entry looks 23 h old, within the 24 h retention. Resuming it
// would resend it under a key the server has forgotten: the operation
// would run twice. With the mark, Resume sends nothing and reports
// ErrClockJump, and a rerun of the operation is refused too. The last
// step shows that the test bites: the same journal, its mark hidden
// behind a Journal without HighWater, makes Resume resend, and the
// server runs the operation a second time. Checked to fail: with
// journalHighWater ignoring ClockJournal, Resume (of the journal's entries or of given ones) and Do
// all go ahead; with fill's clock record holding an earlier time, the
// reopened journal has forgotten t0+25h and Resume resends.
func TestResumeRefusesBelowTheHighWaterMark(t *testing.T) {
	ctx := context.Background()
	clock := &ijClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	t0 := clock.now()
	// The server runs every request it gets: it has forgotten the keys
	// (24 h retention). Its first request's response is lost.
	srv := newScripted(t, drop, reply(200, "{}"))
	path := filepath.Join(t.TempDir(), "journal")
	// No uptime clock: nothing measures the jump (see
	// TestClockSetBackIsMeasured for what one does).
	j, err := Open(path, &Options{PruneInterval: -1, Clock: clock.now, Uptime: noUptime})
	require.NoError(t, err)
	pol := fast()
	pol.MaxAttempts = 1
	newClient := func(j idemhttp.Journal) *idemhttp.Client { return &idemhttp.Client{Journal: j, Policy: pol} }
	c := newClient(j)

	_, err = c.Do(post(t, srv.URL+"/old", chargeBody).WithContext(idemhttp.WithOperation(ctx, "old")))
	require.Error(t, err, "the response was lost")
	clock.set(t0.Add(25 * time.Hour))
	resp, err := c.Do(post(t, srv.URL+"/new", chargeBody).WithContext(idemhttp.WithOperation(ctx, "new")))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	// The done entry is pruned (an operator's `idemctl prune`, say), the
	// file compacted and reopened: nothing in it holds t0+25h but the
	// clock record.
	n, err := j.Prune(ctx, clock.now().Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, j.Compact(ctx))
	require.NoError(t, j.Close())
	j, err = Open(path, &Options{PruneInterval: -1, Clock: clock.now, Uptime: noUptime})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, j.Close()) })
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, t0, pending[0].Created)
	require.Len(t, srv.Hits(), 2)

	clock.set(t0.Add(23 * time.Hour)) // set back 2 h
	c = newClient(j)
	results, err := c.Resume(ctx, nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.ErrorIs(t, results[0].Err, idemhttp.ErrClockJump)
	rs, _ := c.Resume(ctx, &idemhttp.ResumeOptions{Entries: []*idemhttp.Entry{pending[0]}})
	r := rs[0]
	assert.ErrorIs(t, r.Err, idemhttp.ErrClockJump, "a resend of given entries checks the mark too")
	_, err = c.Do(post(t, srv.URL+"/old", chargeBody).WithContext(idemhttp.WithOperation(ctx, "old")))
	assert.ErrorIs(t, err, idemhttp.ErrClockJump, "a rerun of the operation is refused")
	assert.Len(t, srv.Hits(), 2, "nothing resent")
	e, err := j.Lookup(ctx, "old")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StatePending, e.State, "left pending")

	// The control: the journal's entries' own times alone do not show
	// the jump, and the entry is resent.
	results, err = newClient(ijNoMark{j, clock.now}).Resume(ctx, nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.NoError(t, results[0].Err)
	hits := srv.Hits()
	require.Len(t, hits, 3, "without the mark, the operation ran twice")
	assert.Equal(t, hits[0].Key, hits[2].Key)
}

// ijNoMark hides a journal's HighWater: a Journal that is not a
// ClockJournal, with the same clock.
type ijNoMark struct {
	idemhttp.Journal
	clock func() time.Time
}

func (n ijNoMark) Now(context.Context) (time.Time, error) { return n.clock(), nil }

// noUptime is an Options.Uptime without an uptime clock: no evidence of
// how far the clock moved.
func noUptime() (string, time.Duration) { return "", 0 }

// ijClock is a clock a test sets.
type ijClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *ijClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *ijClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Issue 26 §1, end to end: a Stripe-style caller whose process ended
// after the charge succeeded, before it saved the charge's id, reruns with
// a new Client over the reopened journal and gets the result back, as a
// replay, sending nothing. Checked to fail with KeepResults 0: the rerun
// got DoneError and the id was gone.
func TestDoneOperationsResultSurvivesARestart(t *testing.T) {
	ctx := idemhttp.WithOperation(context.Background(), "order-1")
	srv := newScripted(t, reply(201, `{"id":"ch_1","status":"succeeded"}`))
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, nil)
	require.NoError(t, err)
	pol := &idemhttp.Policy{KeepResults: 64 << 10}
	resp, err := (&idemhttp.Client{Journal: j, Policy: pol}).Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close()) // the id was never saved
	require.NoError(t, j.Close())         // the process ends

	j, err = Open(path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, j.Close()) })
	resp, err = (&idemhttp.Client{Journal: j, Policy: pol}).Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, `{"id":"ch_1","status":"succeeded"}`, string(body))
	assert.True(t, idemhttp.Replayed(resp))
	assert.Len(t, srv.Hits(), 1, "nothing sent again")
}
