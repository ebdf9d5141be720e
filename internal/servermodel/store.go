package servermodel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
)

// Op names a call a fault may hit.
type Op string

// The calls of a Store, and the statements of a DB.
const (
	OpClaim    Op = "claim"    // Store.Claim; DB: the BEGIN with the key's lock and claim row
	OpRenew    Op = "renew"    // Store.Renew
	OpComplete Op = "complete" // Store.Complete; DB: the record with COMMIT
	OpRelease  Op = "release"  // Store.Release; DB: the ROLLBACK
	OpLookup   Op = "lookup"   // DB: a look at the key after a rollback
	OpMark     Op = "mark"     // DB: the marker of a handler that ended its transaction
)

// Fault is what a call does instead of, or besides, its work.
type Fault uint8

// The faults.
const (
	// Pass: the call does its work and answers.
	Pass Fault = iota
	// Refuse: the call does nothing and fails (a store out of memory, a
	// statement refused).
	Refuse
	// Hang: the call does nothing until its context ends, then fails with
	// the context's error (a partition).
	Hang
	// Lose: the call does its work, then fails as if its answer was lost
	// on the way back: the caller cannot tell it from Refuse. (A DB
	// connection lost during a COMMIT: the commit happened.)
	Lose
	// Full: the call does nothing and fails for lack of room (a Redis
	// past its maxmemory, a memory store at its bound): its error wraps
	// idemserver.ErrStoreFull.
	Full
)

// ErrRefused is the error of a refused call.
var ErrRefused = errors.New("servermodel: refused")

// ErrLost is the error of a call whose answer was lost.
var ErrLost = errors.New("servermodel: connection lost")

// ErrFull is the error of a call refused for lack of room ([Full]).
var ErrFull = fmt.Errorf("servermodel: out of memory: %w", idemserver.ErrStoreFull)

// Faults decides each call's fault; nil means every call passes. It is
// called once per call, before the call's work, under no lock of the
// model's.
type Faults func(op Op, key string) Fault

// Wait is how a call that hangs waits: until ctx ends, and then, in a
// simulated world, for whatever else the world needs (its turn from the
// world's driver, so that two calls whose bounds end at one instant go on
// one at a time). Nil means until ctx ends.
type Wait func(ctx context.Context, op Op, key string)

// fault waits out a Hang (with wait, nil for ctx alone), and returns the
// error a call fails with before or after its work.
func fault(ctx context.Context, f Faults, wait Wait, op Op, key string) (Fault, error) {
	if f == nil {
		return Pass, nil
	}
	switch x := f(op, key); x {
	case Refuse:
		return x, ErrRefused
	case Hang:
		if wait != nil {
			wait(ctx, op, key)
		} else {
			<-ctx.Done()
		}
		return x, ctx.Err()
	case Lose:
		return x, ErrLost
	case Full:
		return x, ErrFull
	}
	return Pass, nil
}

// before reports whether f fails the call before its work: nothing of it
// happens.
func (f Fault) before() bool { return f == Refuse || f == Hang || f == Full }

var _ idemserver.Store = (*Store)(nil)

// Store is a modelled idemserver.Store: one record per key, a claim held
// by a token until its lock times out, or a completed record kept for its
// TTL, measured on Now. It passes the store conformance suite
// (idemserver/storetest). The zero value is an empty store on the wall
// clock; set Now and Faults before first use. It is safe for concurrent
// use.
type Store struct {
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
	// Faults decides each call's fault; nil: none.
	Faults Faults
	// Wait is how a call that hangs waits; nil: until its context ends.
	Wait Wait

	mu      sync.Mutex
	records map[string]*storeRecord
}

type storeRecord struct {
	token, fingerprint string
	record             []byte // nil while claimed
	expires            time.Time
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// live returns key's live record, dropping an expired one. The caller
// holds s.mu.
func (s *Store) live(key string, now time.Time) *storeRecord {
	r := s.records[key]
	if r != nil && !now.Before(r.expires) {
		delete(s.records, key)
		return nil
	}
	return r
}

// Claim implements idemserver.Store.Claim.
func (s *Store) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	if c.LockTimeout <= 0 {
		return idemserver.ClaimResult{}, errors.New("servermodel: lock timeout must be positive")
	}
	f, err := fault(ctx, s.Faults, s.Wait, OpClaim, key)
	if f.before() {
		return idemserver.ClaimResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	res := idemserver.ClaimResult{State: idemserver.Claimed}
	switch r := s.live(key, now); {
	case r == nil:
		if s.records == nil {
			s.records = map[string]*storeRecord{}
		}
		s.records[key] = &storeRecord{token: c.Token, fingerprint: c.Fingerprint, expires: now.Add(c.LockTimeout)}
	case r.record != nil:
		res = idemserver.ClaimResult{State: idemserver.Completed, Fingerprint: r.fingerprint, Record: r.record}
	case r.token != c.Token:
		res = idemserver.ClaimResult{State: idemserver.InProgress, Fingerprint: r.fingerprint}
	}
	if err != nil {
		return idemserver.ClaimResult{}, err
	}
	return res, nil
}

// held returns key's live claim held by token. The caller holds s.mu.
func (s *Store) held(key, token string, now time.Time) *storeRecord {
	r := s.live(key, now)
	if r == nil || r.record != nil || r.token != token {
		return nil
	}
	return r
}

// call runs a token-checked call: its fault, then work on the claim.
func (s *Store) call(ctx context.Context, op Op, key, token string, work func(r *storeRecord, now time.Time)) error {
	f, err := fault(ctx, s.Faults, s.Wait, op, key)
	if f.before() {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.held(key, token, now)
	if r == nil {
		if err != nil {
			return err
		}
		return idemserver.ErrClaimLost
	}
	work(r, now)
	return err
}

// Renew implements idemserver.Store.Renew.
func (s *Store) Renew(ctx context.Context, key, token string, lockTimeout time.Duration) error {
	if lockTimeout <= 0 {
		return errors.New("servermodel: lock timeout must be positive")
	}
	return s.call(ctx, OpRenew, key, token, func(r *storeRecord, now time.Time) { r.expires = now.Add(lockTimeout) })
}

// Complete implements idemserver.Store.Complete.
func (s *Store) Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error {
	if len(record) == 0 {
		return errors.New("servermodel: empty record")
	}
	return s.call(ctx, OpComplete, key, token, func(r *storeRecord, now time.Time) {
		r.record, r.expires = record, now.Add(ttl)
	})
}

// Release implements idemserver.Store.Release.
func (s *Store) Release(ctx context.Context, key, token string) error {
	return s.call(ctx, OpRelease, key, token, func(*storeRecord, time.Time) { delete(s.records, key) })
}

// Record returns what the store holds under key: the record (nil for a
// claim) and whether a live record is there at all.
func (s *Store) Record(key string) (record []byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key, s.now())
	if r == nil {
		return nil, false
	}
	return r.record, true
}
