package filejournal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// attack7KeptClock opens what a power cut now would leave of d, after a reboot,
// read-only, and returns the clock state the file holds.
func attack7KeptClock(t *testing.T, d *simdisk.Disk, m *machine) clockState {
	t.Helper()
	c := d.Clone()
	c.Crash(nil)
	opts := m.opts(false)
	opts.FS, opts.ReadOnly = c, true
	j, err := Open(fsPath, opts)
	require.NoError(t, err)
	defer func() { assert.NoError(t, j.Close()) }()
	j.clockMu.Lock()
	defer j.clockMu.Unlock()
	return j.clk
}

// Every call that reads the journal's clock, run concurrently while the
// clock is set back again and again (each set-back measured by the
// uptime clock), returns only once every jump found before it started is
// durable: a power cut right after it keeps them. The Finishes are
// write-behind with a bound of an hour: no call may wait for them (the
// test would time out), and none may carry a jump (a power cut would lose
// it). Checked to fail with nowKept not calling keepClock.
func TestAttack7EveryClockReaderKeepsTheJumps(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := newMachine(t0)
	d := simdisk.New(nil)
	opts := m.opts(true)
	opts.FS = d
	opts.writeBehind = time.Hour
	j, err := Open(fsPath, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })

	var seq atomic.Int64
	begin := func() string {
		k := fmt.Sprintf("k-%d", seq.Add(1))
		e := ijEntry(k, "")
		e.Created, e.Updated = time.Time{}, time.Time{}
		_, err := j.Begin(ctx, e)
		require.NoError(t, err)
		return k
	}
	calls := map[string]func(){
		"Begin": func() { begin() },
		"Finish": func() {
			k := begin()
			require.NoError(t, j.Finish(ctx, k, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1}))
		},
		"Now":        func() { _, err := j.Now(ctx); require.NoError(t, err) },
		"ClockDoubt": func() { _, err := j.ClockDoubt(ctx); require.NoError(t, err) },
		"Prune": func() {
			now, err := j.Now(ctx)
			require.NoError(t, err)
			_, err = j.Prune(ctx, now.Add(time.Minute))
			require.NoError(t, err)
		},
		"Compact": func() { require.NoError(t, j.Compact(ctx)) },
	}

	var mu sync.Mutex // one check at a time: each clones the disk
	var wg sync.WaitGroup
	for name, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 15 {
				j.clockMu.Lock()
				before := j.clk
				j.clockMu.Unlock()
				call()
				mu.Lock()
				kept := attack7KeptClock(t, d, m)
				mu.Unlock()
				assert.GreaterOrEqual(t, kept.off, before.off, "%s returned with a jump not on disk", name)
				assert.False(t, kept.doubt.Before(before.doubt), "%s returned with a doubt not on disk", name)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 40 {
			m.set(-2 * time.Hour)
			m.pass(time.Minute)
			time.Sleep(time.Millisecond)
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("a call hung (a write-behind batch waited for, or a deadlock)")
	}
	j.clockMu.Lock()
	defer j.clockMu.Unlock()
	assert.Greater(t, j.clk.off, time.Hour, "the clock was found set back")
}

// A power cut at every disk call of a call that finds a jump: the call
// either fails, or the jump survives the cut (torn writes too). Checked
// to fail with nowKept not calling keepClock.
func TestAttack7PowerCutAroundTheKeep(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	calls := map[string]func(j *Journal) error{
		"Now":        func(j *Journal) error { _, err := j.Now(ctx); return err },
		"ClockDoubt": func(j *Journal) error { _, err := j.ClockDoubt(ctx); return err },
		"Finish": func(j *Journal) error {
			return j.Finish(ctx, "k-1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1})
		},
		"Begin": func(j *Journal) error {
			e := ijEntry("k-2", "")
			e.Created, e.Updated = time.Time{}, time.Time{}
			_, err := j.Begin(ctx, e)
			return err
		},
		"Prune": func(j *Journal) error { _, err := j.Prune(ctx, t0.Add(time.Hour)); return err },
	}
	for name, call := range calls {
		for n := 1; n <= 6; n++ {
			m := newMachine(t0)
			d := simdisk.New(&simdisk.Options{Torn: simdisk.TornSector})
			opts := m.opts(true)
			opts.FS = d
			opts.writeBehind = time.Hour
			j, err := Open(fsPath, opts)
			require.NoError(t, err)
			e := ijEntry("k-1", "")
			e.Created, e.Updated = time.Time{}, time.Time{}
			_, err = j.Begin(ctx, e)
			require.NoError(t, err)
			e = ijEntry("k-0", "")
			e.Created, e.Updated = time.Time{}, time.Time{}
			_, err = j.Begin(ctx, e)
			require.NoError(t, err)
			require.NoError(t, j.Finish(ctx, "k-0", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1}))
			m.set(-2 * time.Hour)
			m.pass(25 * time.Hour)
			d.HaltAt(n)
			err = call(j)
			for seed := range uint64(4) {
				c := d.Clone()
				c.Crash(rand.New(rand.NewPCG(seed, uint64(n))))
				m2 := newMachine(t0)
				m2.reboot("boot-2", 26*time.Hour, time.Minute)
				o2 := m2.opts(true)
				o2.FS = c
				j2, oerr := Open(fsPath, o2)
				require.NoError(t, oerr, "%s, cut at %d", name, n)
				j2.clockMu.Lock()
				off := j2.clk.off
				j2.clockMu.Unlock()
				if err == nil {
					assert.GreaterOrEqual(t, off, 2*time.Hour, "%s returned, cut at %d, seed %d: the jump lost", name, n, seed)
				}
				_ = j2.Close()
			}
			_ = j.Close()
		}
	}
}
