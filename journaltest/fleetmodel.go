package journaltest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/plant"
)

// FleetModel is the contract of [FleetJournal] as a model: a journal a
// fleet of workers shares, in memory, with leases, fencing and one clock
// (the database's). It is what [RunFleet] holds every fleet journal to,
// written down plainly: the simulator (internal/sim) runs a fleet of
// client machines on it, and RunFleet pins it and
// github.com/idemkit/idemhttp/contrib/postgres.Journal to the same
// contract, so that a rule the model keeps and the real journal misses
// fails the conformance suite rather than only the simulation.
//
// It keeps one exact high-water mark for the fleet (the PostgreSQL journal
// shares its mark a few seconds late: see its HighWater), and stores
// everything in memory: nothing of it is durable, and a process that
// dies loses it. Each [FleetModel.Worker] is one worker process's view,
// with a lease token of its own.
//
// A FleetModel is safe for concurrent use. Create it with
// [NewFleetModel].
type FleetModel struct {
	clock func() time.Time
	lease time.Duration

	mu     sync.Mutex
	skew   time.Duration
	byKey  map[string]*modelRow
	byOp   map[string]string
	high   time.Time
	doubt  time.Time // the mark when the clock was found set back below it: see ClockDoubt
	tokens int
	seq    uint64 // rows inserted, for the order of rows created at one instant
}

// FleetModelOptions configures [NewFleetModel]. A nil *FleetModelOptions,
// like the zero value, means the defaults.
type FleetModelOptions struct {
	// Clock is the database's clock, which stamps entries given without
	// times, reckons leases and ages entries for the whole fleet. nil
	// means time.Now, shifted by [FleetModel.Shift].
	Clock func() time.Time

	// Lease is how long an entry a worker began or claimed stays
	// reserved for it. Zero means five minutes, as contrib/postgres's
	// DefaultLease.
	Lease time.Duration
}

type modelRow struct {
	e     *idemhttp.Entry
	seq   uint64
	token string    // the lease's holder, "" for none; kept after the lease expires, as the real journal does
	until time.Time // when the lease ends
}

// NewFleetModel returns an empty fleet journal.
func NewFleetModel(opts *FleetModelOptions) *FleetModel {
	var o FleetModelOptions
	if opts != nil {
		o = *opts
	}
	if o.Lease <= 0 {
		o.Lease = 5 * time.Minute
	}
	return &FleetModel{clock: o.Clock, lease: o.Lease, byKey: make(map[string]*modelRow), byOp: make(map[string]string)}
}

// Shift moves the model's clock by d (forward, or back with a negative
// d) from now on; shifts add up. It is [Fleet.Shift] for [RunFleet]. With
// a Clock of its own, the shift applies to that clock's readings.
func (m *FleetModel) Shift(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.skew += d
}

// Lease returns how long the model's leases last.
func (m *FleetModel) Lease() time.Duration { return m.lease }

// Doubt returns the fleet's clock doubt as it stands (see
// [FleetModelWorker.ClockDoubt]), without reading the clock: for a test's
// checks after a run.
func (m *FleetModel) Doubt() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.doubt
}

// LeasesLeft returns how long, by the model's clock, until the last lease
// held on a pending entry ends; zero when none is held. A clock set back
// since a lease was taken lengthens it by the jump: a test that waits for
// a dead worker's entries to be free waits this long, not one Lease.
func (m *FleetModel) LeasesLeft() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.nowLocked()
	var left time.Duration
	for _, r := range m.byKey {
		if r.e.State == idemhttp.StatePending && r.token != "" {
			left = max(left, r.until.Sub(now))
		}
	}
	return left
}

// Worker returns a new worker's view of the journal, with a lease token
// of its own: a worker process's journal. name is for the leases' owner
// only, as in the real journal; two workers of one name are two workers.
func (m *FleetModel) Worker(name string) *FleetModelWorker {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tokens++
	return &FleetModelWorker{m: m, name: name, token: name + "#" + strconv.Itoa(m.tokens)}
}

// Entries returns every entry the journal holds, whatever its state and
// lease, in the order they were created: for a test's checks of what is
// stored (the simulator's: no secret in it, done only with its effect).
func (m *FleetModel) Entries() []*idemhttp.Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	rows := make([]*modelRow, 0, len(m.byKey))
	for _, r := range m.byKey {
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b *modelRow) int { return int(a.seq) - int(b.seq) })
	out := make([]*idemhttp.Entry, len(rows))
	for i, r := range rows {
		out[i] = cloneEntry(r.e)
	}
	return out
}

// nowLocked reads the clock, and notes a set-back it shows: a clock more
// than idemhttp.ClockTolerance below the high-water mark makes the mark
// the doubt (see ClockDoubt), for good. Every call that reads the clock
// looks, as the PostgreSQL journal's do.
func (m *FleetModel) nowLocked() time.Time {
	now := time.Now()
	if m.clock != nil {
		now = m.clock()
	}
	now = now.Add(m.skew).Round(0)
	if m.high.After(now.Add(idemhttp.ClockTolerance)) && m.high.After(m.doubt) {
		m.doubt = m.high
	}
	return now
}

func (m *FleetModel) raiseLocked(ts ...time.Time) {
	for _, t := range ts {
		if t.After(m.high) {
			m.high = t
		}
	}
}

// pendingLocked returns the pending rows, oldest first (ties in key
// order, as the real journal's ORDER BY created_at, key).
func (m *FleetModel) pendingLocked() []*modelRow {
	var out []*modelRow
	for _, r := range m.byKey {
		if r.e.State == idemhttp.StatePending {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *modelRow) int {
		if c := a.e.Created.Compare(b.e.Created); c != 0 {
			return c
		}
		return strings.Compare(a.e.Key, b.e.Key)
	})
	return out
}

func (m *FleetModel) dropLocked(key string, r *modelRow) {
	m.raiseLocked(r.e.Created, r.e.Updated)
	delete(m.byKey, key)
	if r.e.Operation != "" && m.byOp[r.e.Operation] == key {
		delete(m.byOp, r.e.Operation)
	}
}

// FleetModelWorker is one worker's view of a [FleetModel]: a
// [FleetJournal] and a [ClockJournal], and a [Retainer] as a Client
// expects. Its methods never fail but for the contract's refusals (an
// invalid entry, an unknown key, a fenced write, a clock set back) and a
// context that ended before a write.
type FleetModelWorker struct {
	m         *FleetModel
	name      string
	token     string
	retention time.Duration // the longest Retain; 0: none yet
}

var (
	_ FleetJournal = (*FleetModelWorker)(nil)
	_ ClockJournal = (*FleetModelWorker)(nil)
	_ Retainer     = (*FleetModelWorker)(nil)
	_ Forgetter    = (*FleetModelWorker)(nil)
	_ ClockDoubter = (*FleetModelWorker)(nil)
)

func cloneEntry(e *idemhttp.Entry) *idemhttp.Entry {
	c := *e
	c.Header = e.Header.Clone()
	c.Body = bytes.Clone(e.Body)
	if e.Result != nil {
		r := *e.Result
		r.Header, r.Body = e.Result.Header.Clone(), bytes.Clone(e.Result.Body)
		c.Result = &r
	}
	return &c
}

func earliest(t, now time.Time) time.Time {
	if t.IsZero() || t.After(now) {
		return now
	}
	return t
}

// JournalSenders declares to [idemhttp.Client] what contrib/postgres's
// Journal declares: one worker of a fleet, whose other workers are fenced
// by leases.
func (w *FleetModelWorker) JournalSenders() contract.Senders {
	return contract.Senders{Store: w}
}

// Now returns the model's clock: the fleet's.
func (w *FleetModelWorker) Now(context.Context) (time.Time, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	return w.m.nowLocked(), nil
}

// HighWater returns the latest time the journal ever recorded, for the
// whole fleet.
func (w *FleetModelWorker) HighWater(context.Context) (time.Time, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	return w.m.high, nil
}

// ClockDoubt returns the latest time the journal held when its clock was
// found set back below it (the high-water mark then), the zero Time if it
// never was: an entry created at or before it is of unknown age for good,
// whatever the clock says since (a clock set back and then carried past
// the mark by a day's downtime makes such an entry look younger than it
// is). A Client resends, reuses and refetches none of them
// ([idemhttp.ErrClockJump]); ClaimPending still hands them out (its
// Client reports each) or abandons them past the retention. It only
// grows, and is the fleet's: every worker sees it.
func (w *FleetModelWorker) ClockDoubt(context.Context) (time.Time, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	w.m.nowLocked() // a set-back showing now counts
	return w.m.doubt, nil
}

// Retain tells the worker its Client's retention: ClaimPending then
// abandons entries older than the longest retention it was told, instead
// of handing them out. Before any, it hands every entry out.
func (w *FleetModelWorker) Retain(d time.Duration) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	w.retention = max(w.retention, d)
}

// Begin records e, leased to this worker, or returns the entry for its
// operation (or key) and leases that one to this worker when it is
// pending with e's fingerprint and another worker's (or no one's).
func (w *FleetModelWorker) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	return w.begin(ctx, e, true)
}

// Enqueue records e as Begin does, leased to no one.
func (w *FleetModelWorker) Enqueue(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	return w.begin(ctx, e, false)
}

func (w *FleetModelWorker) begin(ctx context.Context, e *idemhttp.Entry, leased bool) (*idemhttp.Entry, error) {
	if e == nil {
		return nil, fmt.Errorf("journal begin: %w: nil entry", idemhttp.ErrInvalidRequest)
	}
	rec, err := e.Sanitized()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.nowLocked()
	key := rec.Key
	if k, ok := m.byOp[rec.Operation]; ok && rec.Operation != "" {
		key = k
	}
	if r, ok := m.byKey[key]; ok {
		// (plant.NoLeaseTake is a planted bug, false but in a test build.)
		if leased && r.e.State == idemhttp.StatePending && r.e.Fingerprint == rec.Fingerprint && r.token != w.token && !plant.NoLeaseTake {
			r.token, r.until = w.token, now.Add(m.lease)
		}
		return cloneEntry(r.e), nil
	}
	rec = cloneEntry(rec)
	rec.Created, rec.Updated = earliest(rec.Created, now), earliest(rec.Updated, now)
	m.seq++
	r := &modelRow{e: rec, seq: m.seq}
	if leased {
		r.token, r.until = w.token, now.Add(m.lease)
	}
	m.byKey[rec.Key] = r
	if rec.Operation != "" {
		m.byOp[rec.Operation] = rec.Key
	}
	m.raiseLocked(rec.Created, rec.Updated)
	return nil, nil
}

// Finish records o on a pending entry no other worker's live lease
// holds, or adds o's attempts to a final entry in o's own state. A
// definite outcome ends the lease; a pending one keeps it.
func (w *FleetModelWorker) Finish(_ context.Context, key string, o idemhttp.Outcome) error {
	switch o.State {
	case idemhttp.StatePending, idemhttp.StateDone, idemhttp.StateAbandoned:
	default:
		return fmt.Errorf("journal finish %s: %w: unknown state %q", key, idemhttp.ErrInvalidRequest, o.State)
	}
	o, err := o.Sanitized() // what of a response may rest
	if err != nil {
		return fmt.Errorf("journal finish %s: %w", key, err)
	}
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.byKey[key]
	if !ok {
		return fmt.Errorf("journal finish %s: %w", key, idemhttp.ErrNotFound)
	}
	now := m.nowLocked()
	switch {
	case r.e.State != idemhttp.StatePending && r.e.State == o.State:
		r.e.Attempts += o.Attempts
		return nil
	case r.e.State != idemhttp.StatePending && !plant.Unfinal: // a planted bug (internal/plant), false but in a test build
		return fmt.Errorf("journal finish %s: %w: the entry is %s", key, idemhttp.ErrFenced, r.e.State)
	case r.token != "" && r.token != w.token && r.until.After(now):
		return fmt.Errorf("journal finish %s: %w: another worker's lease holds it", key, idemhttp.ErrFenced)
	}
	r.e.State, r.e.LastStatus, r.e.Updated, r.e.NotBefore = o.State, o.Status, earliest(o.At, now), o.NotBefore
	r.e.Attempts += o.Attempts
	if o.Result != nil {
		r.e.Result = cloneEntry(&idemhttp.Entry{Result: o.Result}).Result
	}
	if o.State != idemhttp.StatePending {
		r.token, r.until = "", time.Time{}
	}
	m.raiseLocked(r.e.Updated)
	return nil
}

// Renew extends this worker's lease on a pending entry; refused once
// another worker took it or it is final.
func (w *FleetModelWorker) Renew(_ context.Context, key string) error {
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.byKey[key]
	switch {
	case !ok:
		return fmt.Errorf("journal renew %s: %w", key, idemhttp.ErrNotFound)
	case r.e.State != idemhttp.StatePending || r.token != w.token:
		return fmt.Errorf("journal renew %s: %w", key, idemhttp.ErrFenced)
	}
	r.until = m.nowLocked().Add(m.lease)
	return nil
}

// Get returns key's entry.
func (w *FleetModelWorker) Get(_ context.Context, key string) (*idemhttp.Entry, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	r, ok := w.m.byKey[key]
	if !ok {
		return nil, fmt.Errorf("journal get %s: %w", key, idemhttp.ErrNotFound)
	}
	return cloneEntry(r.e), nil
}

// Lookup returns operation's entry.
func (w *FleetModelWorker) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	w.m.mu.Lock()
	k, ok := w.m.byOp[operation]
	w.m.mu.Unlock()
	if !ok || operation == "" {
		return nil, fmt.Errorf("journal lookup %s: %w", operation, idemhttp.ErrNotFound)
	}
	return w.Get(ctx, k)
}

// Pending returns every pending entry, leased or not, oldest first.
func (w *FleetModelWorker) Pending(context.Context) ([]*idemhttp.Entry, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	var out []*idemhttp.Entry
	for _, r := range w.m.pendingLocked() {
		out = append(out, cloneEntry(r.e))
	}
	return out, nil
}

// ClaimPending leases up to limit pending entries no live lease holds to
// this worker, oldest first; it abandons, instead of handing out, those
// older than the retention it was told, and claims nothing when the
// clock is more than [idemhttp.ClockTolerance] below the high-water mark.
// An entry created at or before the fleet's doubt ([FleetModelWorker.ClockDoubt])
// is handed out all the same: its age is unknown, and the Client refuses
// to resend it.
func (w *FleetModelWorker) ClaimPending(_ context.Context, limit int) ([]*idemhttp.Entry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("claim pending: %w: limit %d", idemhttp.ErrInvalidRequest, limit)
	}
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.nowLocked()
	if m.high.After(now.Add(idemhttp.ClockTolerance)) {
		return nil, fmt.Errorf("claim pending: %w", idemhttp.ErrClockJump)
	}
	var out []*idemhttp.Entry
	for _, r := range m.pendingLocked() {
		if len(out) == limit {
			break
		}
		if r.token != "" && r.until.After(now) {
			continue
		}
		if w.retention > 0 && now.Sub(r.e.Created) > w.retention {
			r.e.State, r.e.Updated, r.token, r.until = idemhttp.StateAbandoned, now, "", time.Time{}
			m.raiseLocked(now)
			continue
		}
		if now.Before(r.e.NotBefore) {
			continue // parked
		}
		r.token, r.until = w.token, now.Add(m.lease)
		out = append(out, cloneEntry(r.e))
	}
	return out, nil
}

// Prune deletes the done entries last updated before cutoff.
func (w *FleetModelWorker) Prune(_ context.Context, cutoff time.Time) (int, error) {
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, r := range m.byKey {
		if r.e.State == idemhttp.StateDone && r.e.Updated.Before(cutoff) {
			m.dropLocked(k, r)
			n++
		}
	}
	return n, nil
}

// Delete withdraws a pending entry this worker holds and nobody sent: its
// lease is this worker's (live or not: nobody took it since) and no
// attempt is recorded. Anything else is refused with ErrFenced: a final
// entry (done, or abandoned: another sender may have sent it before it
// was abandoned, and without the entry a rerun of its operation would
// begin afresh under a new key, issue 32's bugFleetExpiredRerun), one
// another worker has begun or claimed since, one nobody holds (enqueued,
// or its lease cleared), and one with an attempt recorded.
func (w *FleetModelWorker) Delete(_ context.Context, key string) error {
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.byKey[key]
	switch {
	case !ok:
		return fmt.Errorf("journal delete %s: %w", key, idemhttp.ErrNotFound)
	case r.e.State != idemhttp.StatePending:
		return fmt.Errorf("journal delete %s: %w: the entry is %s", key, idemhttp.ErrFenced, r.e.State)
	case r.token != w.token:
		return fmt.Errorf("journal delete %s: %w: the entry is not this worker's", key, idemhttp.ErrFenced)
	case r.e.Attempts > 0:
		return fmt.Errorf("journal delete %s: %w: %d attempts are recorded", key, idemhttp.ErrFenced, r.e.Attempts)
	}
	m.dropLocked(key, r)
	return nil
}

// Forget removes a pending entry no other worker's live lease holds, or
// an abandoned one: an operator's act, for an entry a person has resolved
// (see [Forgetter]). A done entry is refused with ErrFenced: only Prune
// removes it.
func (w *FleetModelWorker) Forget(_ context.Context, key string) error {
	m := w.m
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.byKey[key]
	switch {
	case !ok:
		return fmt.Errorf("journal forget %s: %w", key, idemhttp.ErrNotFound)
	case r.e.State == idemhttp.StateDone:
		return fmt.Errorf("journal forget %s: %w: the entry is done", key, idemhttp.ErrFenced)
	case r.e.State == idemhttp.StatePending && r.token != "" && r.token != w.token && r.until.After(m.nowLocked()):
		return fmt.Errorf("journal forget %s: %w: another worker's lease holds it", key, idemhttp.ErrFenced)
	}
	m.dropLocked(key, r)
	return nil
}
