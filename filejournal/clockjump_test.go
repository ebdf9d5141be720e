package filejournal

import (
	"context"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
)

// machine is a client machine's two clocks, which a test moves: the wall
// clock, which anyone can set, and the uptime clock, which only time
// moves, in the boot it names.
type machine struct {
	mu   sync.Mutex
	wall time.Time
	boot string
	up   time.Duration
}

func newMachine(t0 time.Time) *machine {
	return &machine{wall: t0, boot: "boot-1", up: time.Hour}
}

func (m *machine) now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.wall
}

func (m *machine) uptime() (string, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boot, m.up
}

// pass lets d go by: both clocks move.
func (m *machine) pass(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.wall, m.up = m.wall.Add(d), m.up+d
}

// set sets the wall clock by d: only it moves.
func (m *machine) set(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.wall = m.wall.Add(d)
}

// reboot starts a new boot after d of downtime: the uptime clock starts
// again at up.
func (m *machine) reboot(name string, d, up time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.wall, m.boot, m.up = m.wall.Add(d), name, up
}

// opts are the journal's options on m, with its uptime clock as evidence
// or none.
func (m *machine) opts(evidence bool) *Options {
	o := &Options{PruneInterval: -1, Clock: m.now, Uptime: m.uptime}
	if !evidence {
		o.Uptime = noUptime
	}
	return o
}

// The clock set back while no process had the journal open, then a day
// of downtime that carries it past everything the journal holds: nothing
// on the wall clock shows the jump any more, and a pending entry 24 h
// 30 min old reads 22 h 30 min. In the same boot, the uptime clock shows
// it: the reopened journal measures the jump, its clock goes on from
// where it was (ahead of the machine's by the jump), the entry is
// 24 h 30 min old, and Resume reports it expired without sending it,
// also after a compaction and a reopen from the index file (which carry
// the jump). The control, without an uptime clock, resends it under a
// key a server with 24 h retention has forgotten. Checked to fail with
// clockState.read's track removed (the evidence run resends), and with
// the index file's header not carrying the clock state (the run after
// the compaction resends).
func TestClockSetBackIsMeasured(t *testing.T) {
	ijIndexAlways(t)
	run := func(t *testing.T, evidence bool) (results []idemhttp.ResumeResult, hits int) {
		ctx := context.Background()
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		m := newMachine(t0)
		path := filepath.Join(t.TempDir(), "journal")
		j, err := Open(path, m.opts(evidence))
		require.NoError(t, err)
		srv := newScripted(t, drop, reply(200, "{}"))
		pol := fast()
		pol.MaxAttempts = 1
		_, err = (&idemhttp.Client{Journal: j, Policy: pol}).Do(post(t, srv.URL+"/old", chargeBody).WithContext(idemhttp.WithOperation(ctx, "old")))
		require.Error(t, err, "the response was lost: the entry stays pending")
		m.pass(time.Hour)
		require.NoError(t, j.Close())

		m.set(-2 * time.Hour)                 // nobody looks
		m.pass(23*time.Hour + 30*time.Minute) // a day of downtime
		j, err = Open(path, m.opts(evidence))
		require.NoError(t, err)
		if evidence {
			now, err := j.Now(ctx)
			require.NoError(t, err)
			assert.Equal(t, t0.Add(24*time.Hour+30*time.Minute), now, "the journal's clock: the time that passed")
			// The jump outlives a compaction and an open from the
			// index file it writes.
			require.NoError(t, j.Compact(ctx))
			require.NoError(t, j.Close())
			j, err = Open(path, m.opts(evidence))
			require.NoError(t, err)
			require.True(t, j.Stats().IndexLoaded)
		}
		t.Cleanup(func() { assert.NoError(t, j.Close()) })
		results, err = (&idemhttp.Client{Journal: j, Policy: pol}).Resume(ctx, nil)
		require.NoError(t, err)
		return results, len(srv.Hits())
	}
	t.Run("uptime clock", func(t *testing.T) {
		results, hits := run(t, true)
		require.Len(t, results, 1)
		assert.ErrorIs(t, results[0].Err, idemhttp.ErrKeyExpired)
		assert.Equal(t, 1, hits, "nothing resent")
	})
	t.Run("control: none", func(t *testing.T) {
		results, hits := run(t, false)
		require.Len(t, results, 1)
		assert.NoError(t, results[0].Err)
		assert.Equal(t, 2, hits, "resent past the server's retention: what the uptime clock prevents")
	})
}

// The clock set back with no evidence of how far (no uptime clock: a
// reboot, say), seen while it is below the journal's mark: the journal
// keeps, for good, that entries up to the mark are of unknown age
// (ClockDoubt), so that once the clock has passed the mark again (a day
// later) a pending entry is still not resent, nor a done one refetched
// (RefetchDone), also after a reopen. The control hides ClockDoubt from
// the client, which then resends the pending entry and refetches the
// done one: both reach a server that may have forgotten their keys.
// Checked to fail with the client's age rule (lifecycle.go's
// operation.age) ignoring the doubt (the pending entry resent, the done
// one refetched), and with Now not writing the jump (the reopened
// journal has forgotten it).
func TestClockDoubtOutlivesTheJump(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := newMachine(t0)
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, m.opts(false))
	require.NoError(t, err)
	srv := newScripted(t, drop, reply(200, "{}"))
	pol := fast()
	pol.MaxAttempts = 1
	pol.RefetchDone = true
	_, err = (&idemhttp.Client{Journal: j, Policy: pol}).Do(post(t, srv.URL+"/old", chargeBody).WithContext(idemhttp.WithOperation(ctx, "old")))
	require.Error(t, err, "the response was lost: the entry stays pending")
	resp, err := (&idemhttp.Client{Journal: j, Policy: pol}).Do(post(t, srv.URL+"/done", chargeBody).WithContext(idemhttp.WithOperation(ctx, "done")))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	mark := ijHighWater(t, j)

	m.set(-2 * time.Hour)
	now, err := j.Now(ctx) // the client looks: the jump is seen
	require.NoError(t, err)
	assert.Equal(t, t0.Add(-2*time.Hour), now, "not measured: the clock as it is")
	doubt, err := j.ClockDoubt(ctx)
	require.NoError(t, err)
	assert.Equal(t, mark, doubt)
	require.NoError(t, j.Close())

	m.pass(25 * time.Hour) // past the mark again, by the wall clock
	j, err = Open(path, m.opts(false))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, j.Close()) })
	doubt, err = j.ClockDoubt(ctx)
	require.NoError(t, err)
	assert.Equal(t, mark, doubt, "kept in the file")

	c := &idemhttp.Client{Journal: j, Policy: pol}
	results, err := c.Resume(ctx, nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.ErrorIs(t, results[0].Err, idemhttp.ErrClockJump)
	_, err = c.Do(post(t, srv.URL+"/done", chargeBody).WithContext(idemhttp.WithOperation(ctx, "done")))
	var done *idemhttp.DoneError
	assert.ErrorAs(t, err, &done, "a done entry of unknown age is not refetched")
	assert.Len(t, srv.Hits(), 2, "nothing sent")
	e, err := j.Lookup(ctx, "old")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StatePending, e.State, "left pending, for a person")

	// A new entry, after the jump, is judged by the clock as usual.
	_, err = c.Do(post(t, srv.URL+"/new", chargeBody).WithContext(idemhttp.WithOperation(ctx, "new")))
	require.NoError(t, err)
	require.Len(t, srv.Hits(), 3)

	// The control: without ClockDoubt, the wall clock alone says 22 h
	// and 23 h: resent, and refetched.
	blind := &idemhttp.Client{Journal: ijNoDoubt{j}, Policy: pol}
	results, err = blind.Resume(ctx, nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.NoError(t, results[0].Err)
	resp, err = blind.Do(post(t, srv.URL+"/done", chargeBody).WithContext(idemhttp.WithOperation(ctx, "done")))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Len(t, srv.Hits(), 5, "without the doubt: both sent again")
}

// ijNoDoubt hides a journal's ClockDoubt, and keeps its clock and mark.
type ijNoDoubt struct{ *Journal }

func (n ijNoDoubt) ClockDoubt() {}

// The uptime clock of another boot is no evidence: after a reboot, its
// reading says nothing of the time since the witness the journal holds
// (a machine up longer this time would pass for a clock set back), and
// the journal's clock is the wall clock again. Checked to fail with
// clockState.read comparing uptimes whatever their boot.
func TestClockUptimeOfAnotherBootIsNoEvidence(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := newMachine(t0)
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, m.opts(true))
	require.NoError(t, err)
	ijBeginAt(t, j, "a", time.Time{})
	require.NoError(t, j.Close())

	m.reboot("boot-2", 5*time.Hour, 20*time.Hour) // an uptime far past the witness's
	j, err = Open(path, m.opts(true))
	require.NoError(t, err)
	defer func() { assert.NoError(t, j.Close()) }()
	now, err := j.Now(ctx)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(5*time.Hour), now)
	doubt, err := j.ClockDoubt(ctx)
	require.NoError(t, err)
	assert.True(t, doubt.IsZero())
}

// Steps of the clock within the tolerance (NTP's) are not jumps: the
// journal's clock stands still while the wall clock catches up, never
// goes back, and nothing is written. And a clock set forward is
// followed. Checked to fail with the slack set to zero (a jump found,
// and a witness written, for a step of a second).
func TestClockSmallStepsAreNotJumps(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, evidence := range []bool{true, false} {
		m := newMachine(t0)
		j, err := Open(filepath.Join(t.TempDir(), "journal"), m.opts(evidence))
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, j.Close()) })
		ijBeginAt(t, j, "a", time.Time{})
		writes := j.Stats().Commits
		m.set(-30 * time.Second)
		now, err := j.Now(ctx)
		require.NoError(t, err)
		assert.Equal(t, t0, now, "held, not back")
		m.pass(time.Minute)
		now, err = j.Now(ctx)
		require.NoError(t, err)
		assert.Equal(t, t0.Add(30*time.Second), now)
		m.set(3 * time.Hour)
		now, err = j.Now(ctx)
		require.NoError(t, err)
		assert.Equal(t, t0.Add(3*time.Hour+30*time.Second), now, "forward: followed")
		assert.Equal(t, writes, j.Stats().Commits, "nothing written")
		doubt, err := j.ClockDoubt(ctx)
		require.NoError(t, err)
		assert.True(t, doubt.IsZero())
	}
}

// The machine's own uptime clock: on Linux the kernel's boot id and
// CLOCK_BOOTTIME, the same boot from one reading to the next, and time
// moving forward; elsewhere the process's.
func TestOSUptime(t *testing.T) {
	b1, u1 := osUptime()
	time.Sleep(2 * time.Millisecond)
	b2, u2 := osUptime()
	assert.NotEqual(t, bootID{}, b1)
	assert.Equal(t, b1, b2)
	assert.Greater(t, u2, u1)
	if runtime.GOOS == "linux" {
		assert.NotEqual(t, processBoot(), b1, "the kernel's boot, not the process")
	}
}
