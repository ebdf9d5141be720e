//go:build go1.26

package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
	"github.com/idemkit/idemhttp/journaltest"
)

// machine is one client machine: its clock, its disk (none in a fleet,
// whose journal is the fleet's database) and the runs of the batch job's
// process on it, one at a time. A world has one machine with a file
// journal on its disk, or a fleet of two or three that share a fleet
// journal (Config.Fleet).
type machine struct {
	w         *world
	id        int
	disk      *simdisk.Disk // nil in a fleet
	clockOff  atomic.Int64  // the machine's clock: virtual time plus this
	cli       *clientProc   // the process running now, or the last one
	downSince time.Time
	haltArmed bool         // a power cut is armed at one of its next disk calls
	ops       []int        // its batch: the operations it calls, in order, duplicates included
	boots     atomic.Int64 // power cuts so far: the machine's boot is the next one's
	bootAt    atomic.Int64 // when its boot began, as virtual Unix nanoseconds; 0: the world's start

	// Its clock's set-backs, and whether the journal kept them: backs
	// counts them, kept is how many had been made when the latest call
	// into the journal that reads the clock began, of those that
	// returned without error (readsClock): the journal keeps a jump its
	// clock found on disk before such a call returns. A power cut while
	// backs > kept loses a set-back (world.lostSetBack).
	backs, kept atomic.Int64
	jumps       []clockJump // its clock's jumps, in order (world.mu)
}

// readsClock notes that a call into m's journal that reads its clock
// begins; call the function it returns with the call's error.
func (m *machine) readsClock() func(error) {
	s := m.backs.Load()
	return func(err error) {
		for err == nil {
			k := m.kept.Load()
			if k >= s || m.kept.CompareAndSwap(k, s) {
				return
			}
		}
	}
}

// uptime is the machine's uptime clock, the journal's evidence of a clock
// set back: a boot named by the machine and its power cuts, and the
// virtual time since that boot began. A power cut reboots the machine: a
// set-back across it cannot be measured, and the journal keeps it as its
// doubt (ClockDoubt), as a real machine's would.
func (m *machine) uptime() (string, time.Duration) {
	since := m.w.t0
	if at := m.bootAt.Load(); at != 0 {
		since = time.Unix(0, at)
	}
	return "sim-" + strconv.Itoa(m.id) + "-" + strconv.FormatInt(m.boots.Load(), 10), time.Since(since)
}

// reboot starts the machine's next boot, at a power cut.
func (m *machine) reboot() {
	m.boots.Add(1)
	m.bootAt.Store(time.Now().UnixNano())
}

// clock is the machine's clock: virtual time, plus the jumps the seed
// made.
func (m *machine) clock() time.Time {
	return time.Now().Add(time.Duration(m.clockOff.Load()))
}

func (m *machine) String() string { return fmt.Sprintf("machine %d", m.id) }

// alive returns the machine's running process, nil if none runs.
func (m *machine) alive() *clientProc {
	if p := m.cli; p != nil && !p.dead.Load() {
		return p
	}
	return nil
}

// The fleet. Its journal is journaltest.FleetModel, the contract that
// journaltest.RunFleet holds contrib/postgres's Journal to, on the
// database's clock (virtual time, plus the database's own jumps: a
// failover to a host whose clock is behind). Each process of each machine
// is a worker of its own (a lease token of its own), as each process's
// postgres.Journal is. What is modelled beyond the contract is the
// database's connection: a call may fail before it reaches the database,
// or after its write committed, its answer lost (DBFault).

// dbClock is the fleet database's clock.
func (w *world) dbClock() time.Time {
	return time.Now().Add(time.Duration(w.dbOff.Load()))
}

// errDBLost is a fleet journal call whose connection died: before the
// statement ran, or after it committed, its answer lost.
var errDBLost = errors.New("sim: the database connection was lost")

// fleetJournal is a process's worker on the fleet journal: a
// FleetModelWorker whose calls may fail as a database's do.
type fleetJournal struct {
	*journaltest.FleetModelWorker
	w *world
	p *clientProc
}

// fault draws the fate of one call: nil, or errDBLost before or after
// its write. Calls take their turns (recJournal), so draws come one at a
// time, in the driver's order. A dead process's calls never reach the
// database (before).
func (f *fleetJournal) fault(what string) (before, after bool) {
	w := f.w
	if f.p.dead.Load() {
		return true, false
	}
	if !w.faulty.Load() || !w.drng.permille(w.cfg.DBFault) {
		return false, false
	}
	if w.drng.intn(2) == 0 {
		w.count("database call lost before it ran")
		w.tracef("database: %s lost before it ran", what)
		return true, false
	}
	w.count("database answer lost after the commit")
	w.tracef("database: %s committed, its answer lost", what)
	return false, true
}

func (f *fleetJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	before, after := f.fault("begin " + e.Key)
	if before {
		return nil, errDBLost
	}
	existing, err := f.FleetModelWorker.Begin(ctx, e)
	if after {
		return nil, errDBLost
	}
	return existing, err
}

func (f *fleetJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	before, after := f.fault("finish " + key)
	if before {
		return errDBLost
	}
	err := f.FleetModelWorker.Finish(ctx, key, o)
	if after {
		return errDBLost
	}
	return err
}

func (f *fleetJournal) Delete(ctx context.Context, key string) error {
	before, after := f.fault("delete " + key)
	if before {
		return errDBLost
	}
	err := f.FleetModelWorker.Delete(ctx, key)
	if after {
		return errDBLost
	}
	return err
}

func (f *fleetJournal) ClaimPending(ctx context.Context, limit int) ([]*idemhttp.Entry, error) {
	before, after := f.fault("claim")
	if before {
		return nil, errDBLost
	}
	es, err := f.FleetModelWorker.ClaimPending(ctx, limit)
	if after {
		return nil, errDBLost // leased, and nobody knows: they wait for the lease to end
	}
	return es, err
}

func (f *fleetJournal) Get(ctx context.Context, key string) (*idemhttp.Entry, error) {
	if before, _ := f.fault("get " + key); before {
		return nil, errDBLost
	}
	return f.FleetModelWorker.Get(ctx, key)
}

func (f *fleetJournal) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	if f.p.dead.Load() {
		return nil, errDBLost
	}
	return f.FleetModelWorker.Lookup(ctx, operation)
}

func (f *fleetJournal) Pending(ctx context.Context) ([]*idemhttp.Entry, error) {
	if f.p.dead.Load() {
		return nil, errDBLost
	}
	return f.FleetModelWorker.Pending(ctx)
}

func (f *fleetJournal) Prune(ctx context.Context, cutoff time.Time) (int, error) {
	if f.p.dead.Load() {
		return 0, errDBLost
	}
	return f.FleetModelWorker.Prune(ctx, cutoff)
}
