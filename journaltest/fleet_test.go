package journaltest_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/journaltest"
)

// TestMemFleet runs the fleet section against memFleet, a fleet journal
// in memory, so that the suite is known to pass an implementation other
// than the PostgreSQL one, and to ask nothing of it beyond its contract.
func TestMemFleet(t *testing.T) {
	journaltest.RunFleet(t, func(t *testing.T) *journaltest.Fleet {
		s := &memStore{byKey: make(map[string]*memRow), byOp: make(map[string]string)}
		const lease, retention = time.Minute, 24 * time.Hour
		return &journaltest.Fleet{
			A:         &memWorker{s: s, token: "a", lease: lease, retention: retention},
			B:         &memWorker{s: s, token: "b", lease: lease, retention: retention},
			Lease:     lease,
			Retention: retention,
			Shift:     s.shift,
		}
	})
}

// TestMemFleetConformance: memFleet's workers are journals too.
func TestMemFleetConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
		s := &memStore{byKey: make(map[string]*memRow), byOp: make(map[string]string)}
		return &memWorker{s: s, token: "a", lease: time.Minute, retention: 24 * time.Hour}
	})
}

// memStore is the state the workers share, with a clock of its own: the
// process's, shifted.
type memStore struct {
	mu    sync.Mutex
	skew  time.Duration
	byKey map[string]*memRow
	byOp  map[string]string
	high  time.Time
}

type memRow struct {
	e     *idemhttp.Entry
	token string    // the lease's holder, "" for none
	until time.Time // when the lease ends
}

func (s *memStore) shift(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.skew += d
}

func (s *memStore) nowLocked() time.Time { return time.Now().Add(s.skew).Round(0) }

func (s *memStore) raiseLocked(ts ...time.Time) {
	for _, t := range ts {
		if t.After(s.high) {
			s.high = t
		}
	}
}

// memWorker is one worker's view of a memStore.
type memWorker struct {
	s                *memStore
	token            string
	lease, retention time.Duration
}

var _ journaltest.FleetJournal = (*memWorker)(nil)
var _ journaltest.ClockJournal = (*memWorker)(nil)

func clone(e *idemhttp.Entry) *idemhttp.Entry {
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

func (w *memWorker) Now(context.Context) (time.Time, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.nowLocked(), nil
}

func (w *memWorker) HighWater(context.Context) (time.Time, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.high, nil
}

func (w *memWorker) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	return w.begin(ctx, e, true)
}

func (w *memWorker) Enqueue(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	return w.begin(ctx, e, false)
}

func (w *memWorker) begin(ctx context.Context, e *idemhttp.Entry, leased bool) (*idemhttp.Entry, error) {
	rec, err := e.Sanitized()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	key := rec.Key
	if k, ok := s.byOp[rec.Operation]; ok && rec.Operation != "" {
		key = k
	}
	if r, ok := s.byKey[key]; ok {
		if leased && r.e.State == idemhttp.StatePending && r.e.Fingerprint == rec.Fingerprint {
			r.token, r.until = w.token, now.Add(w.lease)
		}
		return clone(r.e), nil
	}
	rec = clone(rec)
	rec.Created, rec.Updated = earliest(rec.Created, now), earliest(rec.Updated, now)
	r := &memRow{e: rec}
	if leased {
		r.token, r.until = w.token, now.Add(w.lease)
	}
	s.byKey[rec.Key] = r
	if rec.Operation != "" {
		s.byOp[rec.Operation] = rec.Key
	}
	s.raiseLocked(rec.Created, rec.Updated)
	return nil, nil
}

func (w *memWorker) Finish(_ context.Context, key string, o idemhttp.Outcome) error {
	o, err := o.Sanitized()
	if err != nil {
		return fmt.Errorf("finish %s: %w", key, err)
	}
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byKey[key]
	if !ok {
		return fmt.Errorf("finish %s: %w", key, idemhttp.ErrNotFound)
	}
	now := s.nowLocked()
	switch {
	case r.e.State != idemhttp.StatePending && r.e.State == o.State:
		r.e.Attempts += o.Attempts
		return nil
	case r.e.State != idemhttp.StatePending:
		return fmt.Errorf("finish %s: %w: %s", key, idemhttp.ErrFenced, r.e.State)
	case r.token != "" && r.token != w.token && r.until.After(now):
		return fmt.Errorf("finish %s: %w: leased", key, idemhttp.ErrFenced)
	}
	r.e.State, r.e.LastStatus, r.e.Updated, r.e.NotBefore = o.State, o.Status, earliest(o.At, now), o.NotBefore
	r.e.Attempts += o.Attempts
	if o.Result != nil {
		r.e.Result = clone(&idemhttp.Entry{Result: o.Result}).Result
	}
	if o.State != idemhttp.StatePending {
		r.token, r.until = "", time.Time{}
	}
	s.raiseLocked(r.e.Updated)
	return nil
}

func (w *memWorker) Renew(_ context.Context, key string) error {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byKey[key]
	switch {
	case !ok:
		return fmt.Errorf("renew %s: %w", key, idemhttp.ErrNotFound)
	case r.e.State != idemhttp.StatePending || r.token != w.token:
		return fmt.Errorf("renew %s: %w", key, idemhttp.ErrFenced)
	}
	r.until = s.nowLocked().Add(w.lease)
	return nil
}

func (w *memWorker) Get(_ context.Context, key string) (*idemhttp.Entry, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	r, ok := w.s.byKey[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, idemhttp.ErrNotFound)
	}
	return clone(r.e), nil
}

func (w *memWorker) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	w.s.mu.Lock()
	k, ok := w.s.byOp[operation]
	w.s.mu.Unlock()
	if !ok || operation == "" {
		return nil, fmt.Errorf("lookup %s: %w", operation, idemhttp.ErrNotFound)
	}
	return w.Get(ctx, k)
}

// pendingLocked returns the pending rows, oldest first.
func (s *memStore) pendingLocked() []*memRow {
	var out []*memRow
	for _, r := range s.byKey {
		if r.e.State == idemhttp.StatePending {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *memRow) int {
		if c := a.e.Created.Compare(b.e.Created); c != 0 {
			return c
		}
		return strings.Compare(a.e.Key, b.e.Key)
	})
	return out
}

func (w *memWorker) Pending(context.Context) ([]*idemhttp.Entry, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	var out []*idemhttp.Entry
	for _, r := range w.s.pendingLocked() {
		out = append(out, clone(r.e))
	}
	return out, nil
}

func (w *memWorker) ClaimPending(_ context.Context, limit int) ([]*idemhttp.Entry, error) {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	if s.high.After(now.Add(idemhttp.ClockTolerance)) {
		return nil, fmt.Errorf("claim: %w", idemhttp.ErrClockJump)
	}
	var out []*idemhttp.Entry
	for _, r := range s.pendingLocked() {
		if len(out) == limit {
			break
		}
		if r.token != "" && r.until.After(now) {
			continue
		}
		if now.Sub(r.e.Created) > w.retention {
			r.e.State, r.e.Updated, r.token = idemhttp.StateAbandoned, now, ""
			s.raiseLocked(now)
			continue
		}
		if now.Before(r.e.NotBefore) {
			continue // parked
		}
		r.token, r.until = w.token, now.Add(w.lease)
		out = append(out, clone(r.e))
	}
	return out, nil
}

func (w *memWorker) Prune(_ context.Context, cutoff time.Time) (int, error) {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, r := range s.byKey {
		if r.e.State == idemhttp.StateDone && r.e.Updated.Before(cutoff) {
			s.dropLocked(k, r)
			n++
		}
	}
	return n, nil
}

func (w *memWorker) Delete(_ context.Context, key string) error {
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byKey[key]
	switch {
	case !ok:
		return fmt.Errorf("delete %s: %w", key, idemhttp.ErrNotFound)
	case r.e.State == idemhttp.StateDone:
		return fmt.Errorf("delete %s: %w: done", key, idemhttp.ErrFenced)
	case r.e.State == idemhttp.StatePending && r.token != "" && r.token != w.token:
		return fmt.Errorf("delete %s: %w: another worker took it", key, idemhttp.ErrFenced)
	}
	s.dropLocked(key, r)
	return nil
}

func (s *memStore) dropLocked(key string, r *memRow) {
	s.raiseLocked(r.e.Created, r.e.Updated)
	delete(s.byKey, key)
	if r.e.Operation != "" && s.byOp[r.e.Operation] == key {
		delete(s.byOp, r.e.Operation)
	}
}
