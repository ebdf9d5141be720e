package idemserver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for the zero [MemoryStore]'s bounds.
const (
	// DefaultMaxEntries is the most records a MemoryStore holds by
	// default: 1,048,576, about 12 requests a second kept for a day's TTL.
	DefaultMaxEntries = 1 << 20
	// DefaultMaxBytes is the most bytes a MemoryStore's records hold by
	// default: 1 GiB.
	DefaultMaxBytes = 1 << 30
)

// memRecordOverhead approximates what one record costs besides its strings:
// the map entry, the record's fields and the strings' headers.
const memRecordOverhead = 128

// memShards is the number of independently locked parts of a MemoryStore:
// enough that 64 concurrent requests on two to sixteen cores rarely meet on
// one mutex.
const memShards = 64

// sweepEvery is how often (on the store's clock) a shard drops its expired
// records, on the first Claim that comes along. Sweeping from Claim instead
// of a background goroutine keeps the zero value usable and leaves nothing
// running after the store is dropped.
const sweepEvery = time.Minute

var _ Store = (*MemoryStore)(nil)

// MemoryStore is a [Store] held in the process's memory, sharded by key so
// concurrent requests rarely contend. Records vanish with the process, and
// are not shared between processes: use it for a single server instance, in
// tests, or as a model for a shared store.
//
// Records are kept as they come, byte strings the garbage collector need
// not scan, and Claim returns them without copying. Expired records
// (completed ones past their TTL, claims past their lock timeout) are
// invisible at once and deleted by a sweep of their shard at most once a
// minute, or by [MemoryStore.Prune].
//
// The store is bounded by MaxEntries records and MaxBytes bytes. When a new
// claim would pass either bound, Claim first sweeps expired records (the
// key's shard, then, at most once a second, every shard), then refuses
// with [ErrStoreFull] (the middleware answers
// 503 with Retry-After) rather than evict a live record: an evicted
// response or claim would let its key run a second time. Completing a
// claim already admitted is never refused, so the bytes may pass MaxBytes
// by the responses of the claims in progress (each at most the
// middleware's MaxStoredBody).
//
// Size the bounds for the request rate times the TTL: the defaults hold a
// day of about 12 requests a second, and a server past them answers 503
// until records expire. A busier service wants a shared store (Redis,
// PostgreSQL) anyway, or a shorter TTL.
//
// Each principal's scope ([Claim].Scope) is bounded too, by MaxScopeEntries
// and MaxScopeBytes, a quarter of the store's bounds by default: a caller
// that fills its share (with requests its handler refuses with a stored
// 4xx, say) gets ErrStoreFull for its own new keys until its records
// expire, and leaves the other callers three quarters of the room at
// least. It takes four such callers to fill the store. The empty scope
// (SingleTenant, which has one caller) is bounded by the store's bounds
// alone.
//
// The zero value is an empty store ready to use, with the default bounds.
// A MemoryStore is safe for concurrent use and must not be copied after
// first use; set its fields before first use.
type MemoryStore struct {
	// Now returns the current time; nil means [time.Now]. Inject a fake
	// clock to test TTL and lock expiry without sleeping.
	Now func() time.Time

	// MaxEntries bounds the number of records (claims and responses,
	// including expired ones no sweep has deleted yet). Zero means
	// [DefaultMaxEntries]; negative means no bound.
	MaxEntries int

	// MaxBytes bounds the bytes the records hold: their keys, tokens,
	// fingerprints and responses, plus an estimate of 128 bytes of
	// bookkeeping each. Zero means [DefaultMaxBytes]; negative means no
	// bound.
	MaxBytes int64

	// MaxScopeEntries bounds the records of one non-empty scope. Zero
	// means a quarter of MaxEntries (none if that is unbounded); negative
	// means no bound per scope.
	MaxScopeEntries int

	// MaxScopeBytes bounds the bytes of one non-empty scope's records, as
	// MaxBytes counts them. Zero means a quarter of MaxBytes (none if that
	// is unbounded); negative means no bound per scope.
	MaxScopeBytes int64

	entries   atomic.Int64
	bytes     atomic.Int64
	nextPrune atomic.Int64 // Unix nanoseconds: when a full store may sweep every shard again
	announced atomic.Bool  // its capacity was logged (memory_log.go)
	shards    [memShards]memShard
	scopes    [memShards]scopeShard
}

// scopeShard holds the use of the scopes whose hash falls in it. A scope
// is listed while it holds records.
type scopeShard struct {
	mu  sync.Mutex
	use map[string]*scopeUse
	_   [64]byte
}

// scopeUse is what one scope's records hold; guarded by its shard's mu.
type scopeUse struct {
	scope          string
	entries, bytes int64
}

type memShard struct {
	mu        sync.Mutex
	records   map[string]memRecord
	nextSweep time.Time
	_         [64]byte // keep neighbouring shards' mutexes off one cache line
}

// memRecord is an in-progress claim (record nil) or a completed response.
type memRecord struct {
	token       string
	fingerprint string
	record      []byte    // the response once completed
	expires     time.Time // lock expiry while in progress, TTL expiry once completed
	use         *scopeUse // nil for the empty scope
}

// size is what rec under key counts against MaxBytes.
func (rec *memRecord) size(key string) int64 {
	return int64(len(key) + len(rec.token) + len(rec.fingerprint) + len(rec.record) + memRecordOverhead)
}

func (s *MemoryStore) maxEntries() int64 {
	switch {
	case s.MaxEntries == 0:
		return DefaultMaxEntries
	case s.MaxEntries < 0:
		return -1
	}
	return int64(s.MaxEntries)
}

func (s *MemoryStore) maxBytes() int64 {
	switch {
	case s.MaxBytes == 0:
		return DefaultMaxBytes
	case s.MaxBytes < 0:
		return -1
	}
	return s.MaxBytes
}

func (s *MemoryStore) maxScopeEntries() int64 {
	switch {
	case s.MaxScopeEntries < 0:
		return -1
	case s.MaxScopeEntries > 0:
		return int64(s.MaxScopeEntries)
	}
	if m := s.maxEntries(); m >= 0 {
		return max(m/4, 1)
	}
	return -1
}

func (s *MemoryStore) maxScopeBytes() int64 {
	switch {
	case s.MaxScopeBytes < 0:
		return -1
	case s.MaxScopeBytes > 0:
		return s.MaxScopeBytes
	}
	if m := s.maxBytes(); m >= 0 {
		return max(m/4, 1)
	}
	return -1
}

// admitScope reserves room in scope's share for one more record of size
// bytes, or reports false when that would pass a bound. It returns the
// scope's use, nil for the empty scope, which has no share of its own.
func (s *MemoryStore) admitScope(scope string, size int64) (*scopeUse, bool) {
	if scope == "" {
		return nil, true
	}
	sh := &s.scopes[hashString(scope)%memShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u := sh.use[scope]
	if u == nil {
		u = &scopeUse{scope: scope}
	}
	if me := s.maxScopeEntries(); me >= 0 && u.entries+1 > me {
		return nil, false
	}
	if mb := s.maxScopeBytes(); mb >= 0 && u.bytes+size > mb {
		return nil, false
	}
	u.entries++
	u.bytes += size
	if sh.use == nil {
		sh.use = make(map[string]*scopeUse)
	}
	sh.use[scope] = u
	return u, true
}

// addScope adds entries and bytes (negative when they leave) to u's
// scope, and unlists a scope left without records.
func (s *MemoryStore) addScope(u *scopeUse, entries, bytes int64) {
	if u == nil {
		return
	}
	sh := &s.scopes[hashString(u.scope)%memShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	u.entries += entries
	u.bytes += bytes
	if u.entries <= 0 && sh.use[u.scope] == u {
		delete(sh.use, u.scope)
	}
}

// admit reserves room for one more record of size bytes, or reports false
// when that would pass a bound.
func (s *MemoryStore) admit(size int64) bool {
	if max := s.maxEntries(); s.entries.Add(1) > max && max >= 0 {
		s.entries.Add(-1)
		return false
	}
	if max := s.maxBytes(); s.bytes.Add(size) > max && max >= 0 {
		s.bytes.Add(-size)
		s.entries.Add(-1)
		return false
	}
	return true
}

// forget accounts for a deleted record.
func (s *MemoryStore) forget(rec *memRecord, size int64) {
	s.entries.Add(-1)
	s.bytes.Add(-size)
	s.addScope(rec.use, -1, -size)
}

func (s *MemoryStore) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// shard picks key's shard.
func (s *MemoryStore) shard(key string) *memShard {
	return &s.shards[hashString(key)%memShards]
}

// hashString is FNV-1a, which needs no seed and no allocation.
func hashString(key string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}

// Claim implements [Store.Claim]. Its only error is [ErrStoreFull], for
// the store's bounds or c.Scope's share of them.
func (s *MemoryStore) Claim(_ context.Context, key string, c Claim) (ClaimResult, error) {
	now := s.now()
	res, ok := s.claim(key, c, now)
	if ok {
		return res, nil
	}
	// Expired records count until swept, and the key's own shard had none
	// to spare: sweep every shard, at most once a second, and try again.
	if next := s.nextPrune.Load(); s.mayPrune(now.UnixNano(), next) && s.nextPrune.CompareAndSwap(next, now.Add(time.Second).UnixNano()) {
		s.prune(now)
		if res, ok = s.claim(key, c, now); ok {
			return res, nil
		}
	}
	return ClaimResult{}, ErrStoreFull
}

// mayPrune says whether a full store may sweep every shard at now (Unix
// nanoseconds), the gate being next: at most once a second, and at once
// when the clock was set back (next lies more than the gate's second
// ahead), for the gate is a wall-clock reading and records claimed after
// a set-back expire on the set-back clock: without it, a full store would
// answer ErrStoreFull for as long as the clock went back.
func (s *MemoryStore) mayPrune(now, next int64) bool {
	return now >= next || next-now > int64(time.Second)
}

// claim is Claim within key's shard; ok is false when the store is full.
func (s *MemoryStore) claim(key string, c Claim, now time.Time) (_ ClaimResult, ok bool) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.records == nil {
		sh.records = make(map[string]memRecord)
	}
	if !now.Before(sh.nextSweep) {
		sh.sweep(s, now)
		sh.nextSweep = now.Add(sweepEvery)
	}
	old, exists := sh.records[key]
	if exists && now.Before(old.expires) {
		if old.record == nil {
			return ClaimResult{State: InProgress, Fingerprint: old.fingerprint}, true
		}
		return ClaimResult{State: Completed, Fingerprint: old.fingerprint, Record: old.record}, true
	}
	rec := memRecord{token: c.Token, fingerprint: c.Fingerprint, expires: now.Add(c.LockTimeout)}
	if exists {
		// An expired record under key: it goes, whatever happens next.
		delete(sh.records, key)
		s.forget(&old, old.size(key))
	}
	size := rec.size(key)
	if !s.admit(size) {
		// Try once more after sweeping this shard.
		if sh.sweep(s, now) == 0 || !s.admit(size) {
			return ClaimResult{}, false
		}
	}
	use, ok := s.admitScope(c.Scope, size)
	if !ok {
		s.forget(&rec, size) // rec.use is still nil: the global counts alone
		return ClaimResult{}, false
	}
	rec.use = use
	sh.records[key] = rec
	return ClaimResult{State: Claimed}, true
}

// Complete implements [Store.Complete]. It keeps record itself, and
// refuses an empty one, which would read as a claim still in progress.
func (s *MemoryStore) Complete(_ context.Context, key, token string, record []byte, ttl time.Duration) error {
	if len(record) == 0 {
		return errors.New("idemserver: empty record")
	}
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec, err := sh.held(key, token, now)
	if err != nil {
		return err
	}
	rec.record = record
	rec.expires = now.Add(ttl)
	sh.records[key] = rec
	// Never refused, not even past the scope's share: the work is done.
	s.bytes.Add(int64(len(record)))
	s.addScope(rec.use, 0, int64(len(record)))
	return nil
}

// Renew implements [Store.Renew].
func (s *MemoryStore) Renew(_ context.Context, key, token string, lockTimeout time.Duration) error {
	if lockTimeout <= 0 {
		return errors.New("idemserver: renew: lock timeout must be positive")
	}
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec, err := sh.held(key, token, now)
	if err != nil {
		return err
	}
	rec.expires = now.Add(lockTimeout)
	sh.records[key] = rec
	return nil
}

// Release implements [Store.Release].
func (s *MemoryStore) Release(_ context.Context, key, token string) error {
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rec, err := sh.held(key, token, now)
	if err != nil {
		return err
	}
	delete(sh.records, key)
	s.forget(&rec, rec.size(key))
	return nil
}

// held returns the live in-progress record on key owned by token, or
// ErrClaimLost. The caller holds sh.mu.
func (sh *memShard) held(key, token string, now time.Time) (memRecord, error) {
	rec, ok := sh.records[key]
	if !ok || rec.record != nil || rec.token != token || !now.Before(rec.expires) {
		return memRecord{}, ErrClaimLost
	}
	return rec, nil
}

// sweep deletes the shard's expired records and returns how many it
// deleted. The caller holds sh.mu.
func (sh *memShard) sweep(s *MemoryStore, now time.Time) int {
	n := 0
	for k, rec := range sh.records {
		if !now.Before(rec.expires) {
			delete(sh.records, k)
			s.forget(&rec, rec.size(k))
			n++
		}
	}
	return n
}

// Prune deletes every expired record now, instead of waiting for the
// shards' own sweeps, and returns how many it deleted.
func (s *MemoryStore) Prune() int {
	return s.prune(s.now())
}

func (s *MemoryStore) prune(now time.Time) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.sweep(s, now)
		sh.mu.Unlock()
	}
	return n
}

// Len returns the number of records held, including expired ones that no
// sweep has deleted yet: the count MaxEntries bounds.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.records)
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns the bytes the records hold, as MaxBytes counts them.
func (s *MemoryStore) Bytes() int64 { return s.bytes.Load() }
