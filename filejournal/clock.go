package filejournal

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/wal"
)

// HighWater returns the latest time the journal has ever recorded (the
// optional clock mark a Client checks; see journaltest.ClockJournal), the zero Time for a journal that never
// recorded one. That is the latest Created or Updated time of any entry
// it stored, of any outcome Finish recorded, and of every Prune or
// Delete that removed entries (the time it ran), since the file was
// created: entries pruned, deleted or dropped by compaction since count
// too, because compaction writes the mark into the new file (see
// docs/journal-format.md). A journal written by an older build that
// was never compacted by this one counts only the records still in it.
//
// The mark never goes down. A clock set back below it, by more than
// [idemhttp.ClockTolerance], makes [idemhttp.Client.Resume] refuse to resend and
// [idemhttp.Client.Do] refuse to reuse a pending entry ([idemhttp.ErrClockJump]): the age
// of every entry, and so whether the server still holds its key, is then
// in doubt. The journal's own clock ([Journal.Now]) is seldom below it:
// a set-back the machine's uptime clock measures is added to it; one it
// cannot measure leaves the entries up to the mark of unknown age for
// good ([Journal.ClockDoubt]). Entries written while the clock was far
// ahead keep the mark so until the clock passes it; resolve the pending
// entries by hand and start a new journal file to get rid of a wrong
// mark.
//
// HighWater reads memory only. It includes times of writes not yet on
// disk, and of writes that failed: a mark too high only makes the checks
// stricter. After Close it returns an error wrapping [ErrClosed].
func (j *Journal) HighWater(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if err := j.log.Writable(); errors.Is(err, ErrClosed) {
		return time.Time{}, fmt.Errorf("idemhttp: journal high water: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.high.IsZero() {
		return time.Time{}, nil
	}
	return j.high.UTC(), nil
}

// Now returns the journal's clock: the time it stamps on entries and
// outcomes given without one, and by which a [idemhttp.Client] judges
// their ages. It is the machine's clock, never behind the time elapsed
// since a reading the journal holds, as far as the machine's uptime
// clock can tell (see [Options.Uptime]): a clock set back by more than
// [idemhttp.ClockTolerance] since such a reading, in the same boot, is
// measured, and the journal's clock goes on from where it was, ahead of
// the machine's by the jump, from then on (the jump is kept in the file:
// it outlives the process). Entries' ages, Now minus their times, then
// stay the time that has passed, however the clock was set.
//
// A clock below the latest time the journal holds by more than that,
// with no uptime evidence of how far it went back (across a reboot, or
// on a machine without an uptime clock), cannot be corrected: Now
// returns it as it is, and every entry created at or before that time
// has an unknown age from then on, for good ([Journal.ClockDoubt]).
//
// Now writes to the file, and waits for the disk, when the journal has
// found a jump the file does not durably hold yet (as every call that
// reads the clock does); an error is that write's.
func (j *Journal) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	t, err := j.nowKept(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("idemhttp: journal clock: %w", err)
	}
	return t, nil
}

// ClockDoubt returns the latest time the journal held when it found its
// clock set back by an amount it could not measure (see [Journal.Now]):
// an entry created at or before it is of unknown age, since nothing
// tells how long ago the clock stood there, and whether the server still
// holds its key; the zero Time if the journal never found one. A
// [idemhttp.Client] resends and refetches none of those entries
// ([idemhttp.ErrClockJump]), for good: a person resolves them (Delete,
// or [idemhttp.Client.Resume] with given entries once they are known to
// be within the server's retention, after a new journal file). It only
// grows, is kept in the file, and outlives compaction.
//
// After Close it returns an error wrapping [ErrClosed].
func (j *Journal) ClockDoubt(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if err := j.log.Writable(); errors.Is(err, ErrClosed) {
		return time.Time{}, fmt.Errorf("idemhttp: journal clock doubt: %w", err)
	}
	if _, err := j.nowKept(ctx); err != nil { // a jump found now counts
		return time.Time{}, fmt.Errorf("idemhttp: journal clock doubt: %w", err)
	}
	j.clockMu.Lock()
	defer j.clockMu.Unlock()
	if j.clk.doubt.IsZero() {
		return time.Time{}, nil
	}
	return j.clk.doubt.UTC(), nil
}

// now reads the journal's clock (see Now), and notes a jump found.
// unkept reports a jump found, by this reading or an earlier one, that
// is not on disk yet: see nowKept.
func (j *Journal) now() (t time.Time, unkept bool) {
	j.clockMu.Lock()
	defer j.clockMu.Unlock()
	// Both clocks read under the lock: readings in the order of the
	// anchors they make.
	wall := j.clock()
	boot, up := j.uptime()
	t, changed := j.clk.read(wall, boot, up)
	if changed {
		j.clkGen++
	}
	return t, j.clkGen != j.clkKept
}

// nowKept reads the journal's clock, as now, and keeps a jump found
// (keepClock) before it returns: what every call that reads the clock
// does before it goes on.
func (j *Journal) nowKept(ctx context.Context) (time.Time, error) {
	t, unkept := j.now()
	if unkept {
		if err := j.keepClock(ctx); err != nil {
			return time.Time{}, err
		}
	}
	return t, nil
}

// raiseLocked raises the high-water mark to t if t is later. Only the
// wall clock counts: with monotonic readings on both sides, After would
// compare those, and the time of a call made after the clock was set back
// could then lower the mark.
func (j *Journal) raiseLocked(t time.Time) {
	j.high = contract.Latest(j.high, t.Round(0))
	j.clockMu.Lock()
	j.clk.mark = j.high
	j.clockMu.Unlock()
}

// PendingCount returns the number of entries in state pending, for
// Client.Stats (see journaltest.PendingCounter), counted as they change, so it costs a lock and no scan. It includes
// entries whose Begin is still being synced, which [Journal.Pending]
// does not list yet.
func (j *Journal) PendingCount() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.pending
}

// clockSlack is how far the clock may move against the evidence before
// the journal takes it as set back: [idemhttp.ClockTolerance], what the
// client allows. NTP's slewing and small steps stay below it.
const clockSlack = idemhttp.ClockTolerance

// bootID names one boot of the machine (or, where there is no uptime
// clock that outlives a process, one process): readings of the uptime
// clock compare only within one. The zero bootID is none.
type bootID [16]byte

// bootOf is the bootID of an uptime clock's boot name, zero for "".
func bootOf(name string) bootID {
	if name == "" {
		return bootID{}
	}
	sum := sha256.Sum256([]byte(name))
	return bootID(sum[:16])
}

// clockState is what the journal knows of its clock beyond the wall
// clock's reading, and keeps in the file (witness records, and the
// index file's header): see [Journal.Now].
type clockState struct {
	// off is added to the wall clock: the set-backs measured so far. It
	// only grows.
	off time.Duration
	// doubt: entries created at or before it have unknown ages (see
	// [Journal.ClockDoubt]). It only grows.
	doubt time.Time
	// at, boot and up are the last reading (the anchor): the journal's
	// clock, the boot it was taken in (zero: no uptime clock) and the
	// uptime clock then.
	at   time.Time
	boot bootID
	up   time.Duration

	// mark is the journal's high-water mark, as the index holds it
	// (Journal.high): a copy, which read needs under clockMu alone. Not
	// kept in witness records: the file holds it as the records' times.
	mark time.Time
}

// read returns the journal's clock for a reading wall of the machine's
// clock and up of its uptime clock in boot, and moves the anchor to it.
// changed reports a jump found (off or doubt moved), which the file
// must be told.
//
// Within one boot, the time since the anchor is the uptime clock's: the
// journal's clock is never more than clockSlack behind the anchor plus
// that, and when the wall clock is (set back since), off takes the
// difference. Without such evidence (another boot, no uptime clock), a
// wall clock more than clockSlack below the latest time the journal
// holds was set back by an unknown amount: the entries up to that time
// are in doubt. A clock set forward is followed: entries then look older
// than they are, which errs on the side of not resending.
func (c *clockState) read(wall time.Time, boot bootID, up time.Duration) (time.Time, bool) {
	t := wall.Round(0).Add(c.off)
	changed := false
	if boot != (bootID{}) && boot == c.boot && up >= c.up && !c.at.IsZero() {
		track := c.at.Add(up - c.up)
		if d := track.Sub(t); d > clockSlack {
			c.off += d
			t = track
			changed = true
		}
	}
	if ref := contract.Latest(c.mark, c.at); ref.Sub(t) > clockSlack && ref.After(c.doubt) {
		c.doubt = ref
		changed = true
	}
	if t.Before(c.at) && c.at.Sub(t) <= clockSlack {
		t = c.at // a step back within the slack: the clock stands still meanwhile
	}
	c.at, c.boot, c.up = t, boot, up
	return t, changed
}

// merge takes what a witness record later in the file, or an index file,
// says.
func (c *clockState) merge(w *clockState) {
	c.off = max(c.off, w.off)
	c.doubt = contract.Latest(c.doubt, w.doubt)
	c.at, c.boot, c.up = w.at, w.boot, w.up
}

// appendWitness appends a framed witness record of c to dst: the
// anchor, the set-backs measured and the doubt.
func appendWitness(dst []byte, c *clockState) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recHdrLen)...)
	dst = append(dst, kindWitness)
	dst = journalAppendTime(dst, c.at)
	if c.boot == (bootID{}) {
		dst = append(dst, 0)
	} else {
		dst = append(dst, byte(len(c.boot)))
		dst = append(dst, c.boot[:]...)
	}
	dst = binary.AppendVarint(dst, int64(c.up))
	dst = binary.AppendUvarint(dst, uint64(c.off))
	dst = journalAppendTime(dst, c.doubt)
	finishRecord(dst[start:])
	return dst
}

// readWitness reads a witness record's fields after its kind byte.
func (r *journalReader) witness() *clockState {
	c := &clockState{at: r.time()}
	switch n := int(r.byte()); n {
	case 0:
	case len(bootID{}):
		if len(r.b) < n {
			r.fail("short boot id")
			return c
		}
		c.boot = bootID(r.b[:n])
		r.b = r.b[n:]
	default:
		r.fail("boot id of %d bytes", n)
	}
	c.up = time.Duration(r.varint())
	c.off = time.Duration(r.uint63())
	c.doubt = r.time()
	return c
}

// uint63 reads a uvarint that must fit an int64.
func (r *journalReader) uint63() int64 {
	v := r.uvarint()
	if v > math.MaxInt64 {
		r.fail("value %d out of range", v)
		return 0
	}
	return int64(v)
}

// keepClock makes the jumps the clock found durable, and waits for the
// disk: it appends a witness record of the clock's state when none was
// appended since the last jump was found, and waits for the batch that
// holds it. A call that reads the clock calls it before it returns (see
// nowKept), so a jump found is on disk before anything the call reports
// rests on it: a witness that rode with a Finish's write-behind record
// was lost with that record in a power cut, and after the reboot (no
// uptime evidence left) the clock, carried past the high-water mark by
// the downtime, made entries look younger than they were, and Resume
// resent a key the server had forgotten (the simulator's seed 55588).
// Read-only: nothing.
func (j *Journal) keepClock(ctx context.Context) error {
	if j.readOnly {
		return nil
	}
	for {
		j.mu.Lock()
		j.clockMu.Lock()
		gen, kept, b := j.clkGen, j.clkKept, j.clkBatch
		var rec []byte
		if gen != j.clkWritten {
			rec = appendWitness(nil, &j.clk)
		}
		j.clockMu.Unlock()
		if gen == kept {
			j.mu.Unlock()
			return nil
		}
		if rec != nil {
			var retry bool
			var err error
			b, _, retry, err = j.appendLocked(false, len(rec), 0, func(buf []byte) []byte { return append(buf, rec...) })
			if retry {
				continue
			}
			if err != nil {
				return err
			}
			j.clockWritten(gen, b)
		}
		j.mu.Unlock()
		select {
		case <-b.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := b.Err(); err != nil {
			return err
		}
		j.clockMu.Lock()
		j.clkKept = max(j.clkKept, gen)
		j.clockMu.Unlock()
		return nil
	}
}

// clockRecord returns the witness record a batch may carry, and the
// generation of the clock state it holds, or nil: with jumps, one when a
// jump was found since the last one appended; with anchor, one when the
// process has appended none yet and an uptime clock gives it an anchor
// worth keeping (see uptimeFunc). A write-behind batch (a Finish's)
// passes anchor alone: it carries no jump, since nobody waits for it
// (keepClock writes a jump of its own instead), and no anchor while a
// jump is unwritten, since its record would hold the jump too. Called
// with mu held; the caller calls clockWritten once the record is
// appended.
func (j *Journal) clockRecord(anchor, jumps bool) ([]byte, uint64) {
	j.clockMu.Lock()
	defer j.clockMu.Unlock()
	jumped := j.clkGen != j.clkWritten
	due := jumps && jumped || anchor && j.witnessDue && j.clk.boot != (bootID{}) && (jumps || !jumped)
	if !due {
		return nil, 0
	}
	return appendWitness(nil, &j.clk), j.clkGen
}

// clockWritten notes that a witness record of generation gen is in batch
// b. Called with mu held.
func (j *Journal) clockWritten(gen uint64, b *wal.Batch) {
	j.clockMu.Lock()
	defer j.clockMu.Unlock()
	if gen > j.clkWritten || j.clkBatch == nil {
		j.clkWritten, j.clkBatch = gen, b
	}
	j.witnessDue = false
}

// uptimeFunc is the uptime clock of a journal opened with opts (see
// Options.Uptime).
func uptimeFunc(opts *Options) func() (bootID, time.Duration) {
	switch {
	case opts.Uptime != nil:
		f := opts.Uptime
		var last string
		var boot bootID
		return func() (bootID, time.Duration) {
			name, since := f()
			if name != last { // hashed once per boot, not per reading
				last, boot = name, bootOf(name)
			}
			return boot, since
		}
	case opts.Clock != nil:
		return processUptime
	}
	return osUptime
}

// processBoot names this process, as the boot of its uptime clock.
var processBoot = sync.OnceValue(func() bootID {
	var b bootID
	if _, err := rand.Read(b[:]); err != nil {
		return bootOf("process " + strconv.Itoa(os.Getpid()) + " " + processStart.String())
	}
	return b
})

// processStart is when the package was initialised: the origin of
// processUptime.
var processStart = time.Now()

// processUptime is the process's monotonic clock (Go's, in a synctest
// bubble the bubble's time) as an uptime clock whose boot is this
// process: evidence that lasts as long as the process.
func processUptime() (bootID, time.Duration) {
	return processBoot(), time.Since(processStart)
}
