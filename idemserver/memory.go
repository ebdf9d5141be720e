package idemserver

import (
	"context"
	"errors"
	"sync"
	"time"
)

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
// minute, or by [MemoryStore.Prune]. Nothing bounds the number of records
// besides the TTL; the middleware's MaxStoredBody bounds each.
//
// The zero value is an empty store ready to use. A MemoryStore is safe for
// concurrent use and must not be copied after first use.
type MemoryStore struct {
	// Now returns the current time; nil means [time.Now]. Inject a fake
	// clock to test TTL and lock expiry without sleeping.
	Now func() time.Time

	shards [memShards]memShard
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
}

func (s *MemoryStore) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// shard picks key's shard with FNV-1a, which needs no seed and no allocation.
func (s *MemoryStore) shard(key string) *memShard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return &s.shards[h%memShards]
}

// Claim implements [Store.Claim]. It never returns an error.
func (s *MemoryStore) Claim(_ context.Context, key string, c Claim) (ClaimResult, error) {
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.records == nil {
		sh.records = make(map[string]memRecord)
	}
	if !now.Before(sh.nextSweep) {
		sh.sweep(now)
		sh.nextSweep = now.Add(sweepEvery)
	}
	if rec, ok := sh.records[key]; ok && now.Before(rec.expires) {
		if rec.record == nil {
			return ClaimResult{State: InProgress, Fingerprint: rec.fingerprint}, nil
		}
		return ClaimResult{State: Completed, Fingerprint: rec.fingerprint, Record: rec.record}, nil
	}
	sh.records[key] = memRecord{token: c.Token, fingerprint: c.Fingerprint, expires: now.Add(c.LockTimeout)}
	return ClaimResult{State: Claimed}, nil
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
	return nil
}

// Release implements [Store.Release].
func (s *MemoryStore) Release(_ context.Context, key, token string) error {
	now := s.now()
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, err := sh.held(key, token, now); err != nil {
		return err
	}
	delete(sh.records, key)
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
func (sh *memShard) sweep(now time.Time) int {
	n := 0
	for k, rec := range sh.records {
		if !now.Before(rec.expires) {
			delete(sh.records, k)
			n++
		}
	}
	return n
}

// Prune deletes every expired record now, instead of waiting for the
// shards' own sweeps, and returns how many it deleted.
func (s *MemoryStore) Prune() int {
	now := s.now()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.sweep(now)
		sh.mu.Unlock()
	}
	return n
}

// Len returns the number of records held, including expired ones that no
// sweep has deleted yet.
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
