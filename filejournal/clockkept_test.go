package filejournal

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// A jump the clock found is on disk before the call that found it
// returns. Here a Finish finds it: the clock was set back 2 h, then 25 h
// passed in the same boot, and the uptime clock measures the jump. The
// done record is write-behind, and a power cut right after the Finish
// loses it, as designed (the entry is pending again, and would be resent
// under its key). The jump must not go with it: after the reboot, with no
// uptime evidence left, the wall clock, carried past the journal's mark
// by the downtime, says the entry is 23 h old, and only the kept jump
// makes it 25 h: Resume reports the key expired and sends nothing.
//
// Checked to fail with the witness record riding in the Finish's
// write-behind batch, as it did (the simulator's seed 55588: the
// reopened journal's clock was 2 h behind, and Resume resent a key the
// server had forgotten).
func TestClockJumpFoundByFinishIsKept(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := newMachine(t0)
	d := simdisk.New(nil)
	opts := m.opts(true)
	opts.FS = d
	opts.writeBehind = time.Hour // the done record waits for company that never comes
	j, err := Open(fsPath, opts)
	require.NoError(t, err)
	srv := newScripted(t, reply(200, "{}"))
	e := ijEntry("k-1", "op-1")
	e.URL = srv.URL + "/v1/charges"                 // a resend, were there one, stays on 127.0.0.1
	e.Created, e.Updated = time.Time{}, time.Time{} // the journal's clock stamps it
	existing, err := j.Begin(ctx, e)
	require.NoError(t, err)
	require.Nil(t, existing)

	m.set(-2 * time.Hour)
	m.pass(25 * time.Hour)
	require.NoError(t, j.Finish(ctx, "k-1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1}))
	d.Crash(nil) // the power goes: nothing unsynced survives
	_ = j.Close()
	m.reboot("boot-2", time.Minute, time.Minute)

	j, err = Open(fsPath, opts)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, j.Close()) })
	got, err := j.Get(ctx, "k-1")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StatePending, got.State, "the write-behind done record was lost, as designed")
	now, err := j.Now(ctx)
	require.NoError(t, err)
	assert.WithinDuration(t, t0.Add(25*time.Hour+time.Minute), now, time.Minute, "the journal's clock: the time that passed, the jump kept")

	pol := fast()
	pol.MaxAttempts = 1
	results, err := (&idemhttp.Client{Journal: j, Policy: pol}).Resume(ctx, nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.ErrorIs(t, results[0].Err, idemhttp.ErrKeyExpired)
	assert.Empty(t, srv.Hits(), "nothing resent past the server's retention")
}
