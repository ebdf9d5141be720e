//go:build go1.26

package sim

import (
	"math/rand/v2"
	"strings"
	"syscall"

	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// The journal's open under faults (issue 32 §1.1, Config.OpenFaults). A
// process that starts opens its journal; the open reads what the last
// process left, keeps a torn tail aside, makes the last batch durable
// (the settling open), upgrades the header, removes a rewrite's leftover:
// writes, syncs, truncations and removals, each of which the disk may
// fail, and under which the power may be cut. A real batch job whose open
// fails exits, and its supervisor starts it again; so does the world's.
// What the invariants ask is unchanged: the journal opens once the faults
// stop (the recovery's open has none), and nothing acknowledged is lost
// or run twice (5, 1), whatever the failed opens left.

// openJournal opens p's journal on its machine's disk. It returns nil
// when the open failed, with p dead: a failure an injected fault explains
// is the job's to retry (the machine restarts it), any other is
// invariant 5's.
func (w *world) openJournal(p *clientProc) *filejournal.Journal {
	m := p.m
	faults := w.cfg.OpenFaults && w.faulty.Load()
	w.quietDisk.Store(!faults)
	w.opening.Store(true)
	defer func() {
		w.quietDisk.Store(false)
		w.opening.Store(false)
	}()
	if faults && !m.haltArmed && w.drng.pick(w.cfg.OpenCut) {
		n := 1 + w.drng.intn(6)
		w.count("power cut armed in the open")
		w.tracef("client %d: power cut at its disk call %d from now, in the journal's open", p.n, n)
		m.disk.HaltAt(n)
		m.haltArmed = true
	}
	before := w.diskFaults()
	read := m.readsClock() // the open reads the clock, and keeps a jump it measures
	fj, err := filejournal.Open(journalPath, &filejournal.Options{
		FS:    procFS{d: m.disk, p: p},
		Clock: m.clock,
		// The uptime clock: the machine's boot, named by the machine
		// and its power cuts (a process crash keeps it, a power cut
		// starts the next), its time the bubble's since the boot began
		// (the default names the process's boot by a random id, and its
		// time from the package's start, outside the bubble: the clock's
		// witness records then differed from one process to the next,
		// and so did a seed's trace).
		Uptime:        m.uptime,
		Rand:          rand.NewChaCha8(w.seedBytes(uint64(p.n))),
		PruneInterval: -1,
	})
	read(err)
	if err == nil {
		return fj
	}
	switch {
	case m.disk.Halted():
		w.tracef("client %d: the journal's open was cut: %v", p.n, err)
		w.powerCut(p, "in the journal's open")
	case faults && w.diskFaults() > before:
		w.count("journal open failed")
		w.tracef("client %d: the journal's open failed: %v; the job exits, to be started again", p.n, err)
		w.die(p, func() {})
	default:
		w.failKnown(invJournal, -1, w.cacheKnown(), "client %d: the journal does not open after a crash: %v", p.n, err)
		p.dead.Store(true)
	}
	return nil
}

// diskFaults is how many faults the disks have had so far.
func (w *world) diskFaults() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k, v := range w.stats {
		if strings.HasPrefix(k, "disk ") {
			n += v
		}
	}
	return n
}

// openFault is the disk's fault for a call of an open with faults: the
// open's own rate (Config.OpenErr), which is higher than the run's (a disk
// that failed once is more likely to fail as it is read back), on every
// call that changes the disk.
func (w *world) openFault(op simdisk.Op) error {
	switch op.Kind {
	case simdisk.OpWrite, simdisk.OpSync, simdisk.OpTruncate, simdisk.OpRename, simdisk.OpRemove, simdisk.OpSyncDir:
	case simdisk.OpOpen:
		if op.Flag&0x40 == 0 { // O_CREATE
			return nil
		}
	default:
		return nil
	}
	if !w.drng.permille(w.cfg.OpenErr) {
		return nil
	}
	if op.Kind == simdisk.OpWrite && w.drng.intn(2) == 0 {
		w.diskFailed("disk ENOSPC on write in the open", op)
		return syscall.ENOSPC
	}
	w.diskFailed("disk EIO on "+op.Kind.String()+" in the open", op)
	return syscall.EIO
}
