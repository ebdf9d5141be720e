package filejournal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"
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
// in doubt. Entries written while the clock was far ahead keep it so
// until the clock passes the mark; resolve the pending entries by hand
// and start a new journal file to get rid of a wrong mark.
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
// outcomes given without one, and by which a [idemhttp.Client] judges their ages.
// For a Journal that is the machine's clock.
func (j *Journal) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	return j.now(), nil
}

func (j *Journal) now() time.Time { return j.clock() }

// raiseLocked raises the high-water mark to t if t is later. Only the
// wall clock counts: with monotonic readings on both sides, After would
// compare those, and the time of a call made after the clock was set back
// could then lower the mark.
func (j *Journal) raiseLocked(t time.Time) {
	j.high = contract.Latest(j.high, t.Round(0))
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
