package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemhttp"
)

// highWaterSlack is how far this Journal lets the latest time it recorded
// run ahead of the mark in idemhttp_journal_clock before it raises the
// mark: one small write per slack (and per process) while the clock
// advances, instead of a write to one hot row in every transaction, which
// would serialise the whole fleet's commits. Its own HighWater is exact;
// other processes see the mark at most this much behind, so a clock set
// back by more than idemhttp.ClockTolerance plus the slack is seen by all.
const highWaterSlack = 10 * time.Second

// raiseSQL raises the mark to $1 unless it is higher already.
const raiseSQL = `
INSERT INTO idemhttp_journal_clock AS c (id, high) VALUES (1, $1)
ON CONFLICT (id) DO UPDATE SET high = excluded.high WHERE c.high < excluded.high`

// raiseFromDeleted follows a CTE d of deleted rows' times t: it raises the
// mark to the latest of them and $2 (this Journal's own), so that the
// times outlive the rows.
const raiseFromDeleted = `,
m AS (INSERT INTO idemhttp_journal_clock AS c (id, high)
    SELECT 1, greatest(max(t), $2::timestamptz) FROM d HAVING count(*) > 0
    ON CONFLICT (id) DO UPDATE SET high = excluded.high WHERE c.high < excluded.high)`

// sampleTTL is how long a clockSample answers Now and HighWater.
const sampleTTL = 500 * time.Millisecond

// clockSample is the database's clock and the stored high-water mark as
// the statement that read an entry saw them. A Client that finds an entry
// (Begin of an operation run again, or of a claimed entry it resends)
// asks for both at once, to judge the entry's age and the clock: the
// sample answers without two more round trips, consistent with the entry
// it came with. Within sampleTTL the database's clock is the sample's plus
// the monotonic time elapsed since, off by no more than the clocks' drift
// over that half second; Prune and Delete, which may raise the mark,
// discard it.
type clockSample struct {
	at   time.Time // when it was read, by this process's monotonic clock
	now  time.Time // the database's now()
	mark time.Time // idemhttp_journal_clock's mark, zero for none
}

// sample keeps a clock sample read with an entry.
func (j *Journal) sample(now time.Time, mark *time.Time) {
	s := clockSample{at: time.Now(), now: now}
	if mark != nil {
		s.mark = *mark
	}
	j.mu.Lock()
	j.last = s
	if s.mark.After(j.stored) {
		j.stored = s.mark
	}
	j.mu.Unlock()
}

func (j *Journal) unsample() {
	j.mu.Lock()
	j.last = clockSample{}
	j.mu.Unlock()
}

// fresh returns the clock sample if it is younger than sampleTTL.
func (j *Journal) fresh() (clockSample, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.last.at.IsZero() {
		return clockSample{}, false
	}
	age := time.Since(j.last.at)
	return j.last, age >= 0 && age < sampleTTL
}

// Now returns the journal's clock: the database's now() or, with
// [JournalOptions.Clock], that clock's reading. It is the time the journal
// stamps on entries and outcomes given without one, and leases are
// reckoned by; an [idemhttp.Client] that sees Now (see
// journaltest.Clock) ages the entries by it and leaves their times to the
// journal, so that one clock serves the whole fleet, however the workers'
// clocks disagree. The error is the database's, or ctx's.
func (j *Journal) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if j.clock != nil {
		return j.clock(), nil
	}
	if s, ok := j.fresh(); ok {
		return s.now.Add(time.Since(s.at)), nil
	}
	var t time.Time
	err := retry(ctx, func() error {
		return j.db.QueryRow(ctx, "SELECT now()").Scan(&t)
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("idemhttp/postgres: journal now: %w", err)
	}
	return t, nil
}

// HighWater returns the latest time the journal has ever recorded (see
// journaltest.ClockJournal), the zero Time when it recorded none: an
// entry's Created or Updated time, an outcome's, including those of
// entries pruned or deleted since. It is kept in the one-row table
// idemhttp_journal_clock, which every Journal of the fleet raises (at
// most every few seconds while its clock advances) and Prune and Delete
// raise to the times of the rows they remove, and this Journal adds the
// times it recorded itself. The mark never goes down: a clock more than
// [idemhttp.ClockTolerance] below it was set back (a database restored or
// failed over to a host whose clock is behind), so no entry's age is
// known, and [idemhttp.Client] then neither resends nor reuses an entry,
// and [Journal.ClaimPending] claims nothing ([idemhttp.ErrClockJump]).
// Once the entries are resolved by hand, an operator clears a wrong mark
// with DELETE FROM idemhttp_journal_clock.
func (j *Journal) HighWater(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	// A fresh sample's mark is in j.stored already (sample keeps the
	// later of the two), as is the one storedMark reads: j.stored is then
	// the latest mark known, and never goes down.
	if _, ok := j.fresh(); !ok {
		if err := j.storedMark(ctx); err != nil {
			return time.Time{}, fmt.Errorf("idemhttp/postgres: journal high water: %w", err)
		}
	}
	j.mu.Lock()
	mark := j.stored
	if j.seen.After(mark) {
		mark = j.seen
	}
	j.mu.Unlock()
	// A clock found below the mark is recorded as the fleet's doubt (see
	// ClockDoubt), so that the set-back outlives the moment it shows: a
	// Client reads HighWater before every resend.
	if !mark.IsZero() {
		if now, err := j.Now(ctx); err == nil && mark.After(now.Add(idemhttp.ClockTolerance)) {
			if _, _, _, err := j.readClock(ctx); err != nil {
				return time.Time{}, fmt.Errorf("idemhttp/postgres: journal high water: %w", err)
			}
		}
	}
	return mark, nil
}

// storedMark reads the mark in idemhttp_journal_clock (none if no row)
// into j.stored, for HighWater and so that recorded does not raise it
// needlessly.
func (j *Journal) storedMark(ctx context.Context) error {
	var high time.Time
	err := retry(ctx, func() error {
		return j.db.QueryRow(ctx, "SELECT high FROM idemhttp_journal_clock WHERE id = 1").Scan(&high)
	})
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	j.mu.Lock()
	if high.After(j.stored) {
		j.stored = high
	}
	j.mu.Unlock()
	return nil
}

// seenMark returns the latest time this Journal recorded, nil for none,
// as a statement's argument.
func (j *Journal) seenMark() *time.Time {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.seen.IsZero() {
		return nil
	}
	t := j.seen
	return &t
}

// recorded notes t, a time this Journal has just written, and raises the
// stored mark when t runs more than highWaterSlack ahead of it. A failure
// to raise it is not the caller's (its write committed): the next write
// tries again.
func (j *Journal) recorded(ctx context.Context, t time.Time) {
	j.mu.Lock()
	if t.After(j.seen) {
		j.seen = t
	}
	mark := j.seen
	raise := mark.Sub(j.stored) > highWaterSlack
	j.mu.Unlock()
	if !raise {
		return
	}
	if err := retry(ctx, func() error {
		_, err := j.db.Exec(ctx, raiseSQL, mark)
		return err
	}); err != nil {
		return
	}
	j.mu.Lock()
	if mark.After(j.stored) {
		j.stored = mark
	}
	j.mu.Unlock()
}

// clockBack returns an error wrapping [idemhttp.ErrClockJump] when the
// journal's clock is more than [idemhttp.ClockTolerance] below the
// high-water mark, nil otherwise; it records the doubt (see ClockDoubt).
func (j *Journal) clockBack(ctx context.Context) error {
	_, mark, now, err := j.readClock(ctx)
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: claim pending: %w", err)
	}
	if mark != nil && mark.After(now.Add(idemhttp.ClockTolerance)) {
		return fmt.Errorf("idemhttp/postgres: claim pending: %w: the journal holds times up to %s, its clock says %s",
			idemhttp.ErrClockJump, mark.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return nil
}

// readClockSQL reads the stored doubt, the mark (the stored one or $1,
// this Journal's own) and the journal's clock; when the clock is more than
// the tolerance ($3) below the mark, it records the mark as the doubt, in
// the same statement, so that the set-back is kept whoever saw it.
var readClockSQL = sqlNow(`
WITH r AS (SELECT (SELECT doubt FROM idemhttp_journal_clock WHERE id = 1) AS doubt,
        greatest((SELECT high FROM idemhttp_journal_clock WHERE id = 1), $1::timestamptz) AS high,
        {now} AS now),
w AS (INSERT INTO idemhttp_journal_clock AS c (id, high, doubt)
    SELECT 1, r.high, r.high FROM r WHERE r.high > r.now + $3::interval
    ON CONFLICT (id) DO UPDATE SET high = greatest(c.high, excluded.high), doubt = greatest(c.doubt, excluded.doubt)
    RETURNING c.doubt)
SELECT coalesce((SELECT doubt FROM w), r.doubt), r.high, r.now FROM r`, 2)

// readClock reads the doubt, the mark and the journal's clock, and
// records a set-back it shows (see readClockSQL).
func (j *Journal) readClock(ctx context.Context) (doubt, mark *time.Time, now time.Time, err error) {
	err = retry(ctx, func() error {
		return j.db.QueryRow(ctx, readClockSQL, j.seenMark(), j.now(), idemhttp.ClockTolerance).Scan(&doubt, &mark, &now)
	})
	return doubt, mark, now, err
}

// ClockDoubt returns the latest time the journal held when its clock was
// found more than [idemhttp.ClockTolerance] below the high-water mark
// (set back: a database restored or failed over to a host whose clock is
// behind), the zero Time if it never was (see journaltest.ClockDoubter).
// An entry created at or before it is of unknown age for good, whatever
// the clock says since: a clock set back and then carried past the mark
// by a day's downtime makes such an entry look younger than it is, and
// resending it could reach a server that forgot its key (issue 32's
// bugFleetClock). An [idemhttp.Client] resends, reuses and refetches none
// of those entries ([idemhttp.ErrClockJump]); a person resolves them
// ([Journal.Forget], or Resume with given entries once they are known to
// be within the server's retention).
//
// The doubt is kept in idemhttp_journal_clock.doubt, for the whole fleet;
// ClaimPending, HighWater and ClockDoubt record it when they see the
// clock below the mark. It only grows; an operator clears it, with the
// mark, by DELETE FROM idemhttp_journal_clock once the entries are
// resolved. The error is the database's, or ctx's.
func (j *Journal) ClockDoubt(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	doubt, _, _, err := j.readClock(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("idemhttp/postgres: journal clock doubt: %w", err)
	}
	if doubt == nil {
		return time.Time{}, nil
	}
	return *doubt, nil
}
