package idemhttp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The file's layout (format version 2): seven top-level bbolt buckets.
//
// An entry is two records under one sequence number, drawn from the
// requests bucket's sequence and stored as 8 bytes big endian, so that new
// entries append to the rightmost leaves of both buckets:
//
//   - requests: seq -> request record (method, URL, headers, body). Written
//     once by Begin and never changed: the bulk of an entry (a 1 KiB body
//     makes a 1.2 KiB record) costs one append.
//   - states: seq -> state record (key, operation, fingerprint, state,
//     times, attempts, last status), about 130 bytes. Finish rewrites it;
//     the entries that calls are finishing are the recent ones, so their
//     records share the last few leaves.
//
// The rest are indexes that every write keeps in step within the same
// transaction, and that journalVerify checks against the records:
//
//   - keys: idempotency key -> seq. The only bucket in random order (keys
//     are UUIDv4), so its records are kept as small as they can be, and
//     only Begin, Delete and Prune write it.
//   - operations: operation -> key.
//   - pending: created time + key -> seq, for entries in state pending.
//   - done: updated time + key -> seq, for entries in state done.
//
// Version 1 stored each entry whole (1.3 KiB) under its key: every Begin
// and Finish rewrote a random leaf, about 55 dirty pages per group commit
// at 64 concurrent callers, and Finish decoded and re-encoded the body.
//
// journalMeta holds the format version, checked on open.
var (
	journalMeta     = []byte("idemhttp")   // "version" -> journalVersion
	journalKeys     = []byte("keys")       // key -> seq
	journalStates   = []byte("states")     // seq -> state record
	journalRequests = []byte("requests")   // seq -> request record
	journalOps      = []byte("operations") // operation -> key
	journalPending  = []byte("pending")    // created time + key -> seq, for entries in state pending
	journalDone     = []byte("done")       // updated time + key -> seq, for entries in state done

	journalBucketNames = [][]byte{journalMeta, journalKeys, journalStates, journalRequests, journalOps, journalPending, journalDone}

	journalVersionKey = []byte("version")
)

// Fill factors, set on every transaction's handles (bbolt does not store
// them). bbolt splits a leaf at FillPercent of a page; its default of 0.5
// suits random inserts, but leaves append-only buckets half empty, writing
// twice the pages. Requests are append-only. States and done records are
// appended too, but a state record grows by a byte or two when finished,
// so its pages keep some room.
const (
	journalFillAppend = 1.0
	journalFillMostly = 0.9
)

// journalTimeKeyLen is the length of the time prefix in index keys.
const journalTimeKeyLen = 12

// journalSeqLen is the length of a sequence number as stored.
const journalSeqLen = 8

// journalTimeKey is an index key: t as 8 bytes of Unix seconds with the
// sign bit flipped and 4 bytes of nanoseconds, big endian so that byte
// order is time order (before 1970 too), then the entry's key.
func journalTimeKey(t time.Time, key []byte) []byte {
	b := make([]byte, journalTimeKeyLen, journalTimeKeyLen+len(key))
	binary.BigEndian.PutUint64(b, uint64(t.Unix())^(1<<63))
	binary.BigEndian.PutUint32(b[8:], uint32(t.Nanosecond()))
	return append(b, key...)
}

// journalSeqKey is a sequence number as stored: big endian, so that byte
// order is creation order.
func journalSeqKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, journalSeqLen), seq)
}

// journalTx is the journal's buckets within one transaction.
type journalTx struct {
	keys, states, requests, ops, pending, done *bolt.Bucket
}

func journalBuckets(tx *bolt.Tx) (journalTx, error) {
	b := journalTx{
		keys:     tx.Bucket(journalKeys),
		states:   tx.Bucket(journalStates),
		requests: tx.Bucket(journalRequests),
		ops:      tx.Bucket(journalOps),
		pending:  tx.Bucket(journalPending),
		done:     tx.Bucket(journalDone),
	}
	if b.keys == nil || b.states == nil || b.requests == nil || b.ops == nil || b.pending == nil || b.done == nil {
		return b, fmt.Errorf("%w: a bucket is missing", ErrJournalCorrupt)
	}
	if tx.Writable() {
		b.requests.FillPercent = journalFillAppend
		b.states.FillPercent = journalFillMostly
		b.done.FillPercent = journalFillMostly
	}
	return b, nil
}

// seqOf returns the sequence number of key's entry, or ErrNotFound.
func (b journalTx) seqOf(key []byte) ([]byte, error) {
	seq := b.keys.Get(key)
	if seq == nil {
		return nil, ErrNotFound
	}
	if len(seq) != journalSeqLen {
		return nil, fmt.Errorf("%w: key %q maps to a %d-byte sequence number", ErrJournalCorrupt, key, len(seq))
	}
	return seq, nil
}

// state decodes the state record at seq, which must belong to key.
func (b journalTx) state(seq, key []byte) (journalState, error) {
	v := b.states.Get(seq)
	if v == nil {
		return journalState{}, fmt.Errorf("%w: key %q maps to missing entry %d", ErrJournalCorrupt, key, journalSeqNum(seq))
	}
	s, err := journalDecodeState(v)
	if err != nil {
		return journalState{}, fmt.Errorf("entry %q: %w", key, err)
	}
	if !bytes.Equal(s.key, key) {
		return journalState{}, fmt.Errorf("%w: key %q maps to the entry of key %q", ErrJournalCorrupt, key, s.key)
	}
	return s, nil
}

// get decodes the entry stored for key.
func (b journalTx) get(key []byte) (*Entry, error) {
	seq, err := b.seqOf(key)
	if err != nil {
		return nil, err
	}
	s, err := b.state(seq, key)
	if err != nil {
		return nil, err
	}
	return b.withRequest(seq, &s)
}

// withRequest returns s as an Entry completed with its request record.
func (b journalTx) withRequest(seq []byte, s *journalState) (*Entry, error) {
	e := s.entry()
	v := b.requests.Get(seq)
	if v == nil {
		return nil, fmt.Errorf("%w: entry %q: request record missing", ErrJournalCorrupt, e.Key)
	}
	if err := journalDecodeRequest(v, e); err != nil {
		return nil, fmt.Errorf("entry %q: request: %w", e.Key, err)
	}
	return e, nil
}

func journalSeqNum(seq []byte) uint64 {
	if len(seq) != journalSeqLen {
		return 0
	}
	return binary.BigEndian.Uint64(seq)
}

// indexed returns the state record an index record (k, seq) points to,
// checking that the entry agrees with the index.
func (b journalTx) indexed(k, seq []byte, want State) (journalState, error) {
	if len(k) <= journalTimeKeyLen || len(seq) != journalSeqLen {
		return journalState{}, fmt.Errorf("%w: %s index record of %d+%d bytes", ErrJournalCorrupt, want, len(k), len(seq))
	}
	key := k[journalTimeKeyLen:]
	v := b.states.Get(seq)
	if v == nil {
		return journalState{}, fmt.Errorf("%w: %s index points to missing entry %q", ErrJournalCorrupt, want, key)
	}
	s, err := journalDecodeState(v)
	if err != nil {
		return journalState{}, fmt.Errorf("entry %q: %w", key, err)
	}
	t := s.created
	if want == StateDone {
		t = s.updated
	}
	if s.state != want || !bytes.Equal(journalTimeKey(t, s.key), k) {
		return journalState{}, fmt.Errorf("%w: %s index disagrees with entry %q", ErrJournalCorrupt, want, s.key)
	}
	return s, nil
}

// reindex moves an entry's index records from its previous to its new
// state and times.
func (b journalTx) reindex(key, seq []byte, prev, next *journalState) error {
	if prev.state == StatePending && (next.state != StatePending || !next.created.Equal(prev.created)) {
		if err := b.pending.Delete(journalTimeKey(prev.created, key)); err != nil {
			return err
		}
	}
	if next.state == StatePending && (prev.state != StatePending || !next.created.Equal(prev.created)) {
		if err := b.pending.Put(journalTimeKey(next.created, key), seq); err != nil {
			return err
		}
	}
	if prev.state == StateDone {
		if err := b.done.Delete(journalTimeKey(prev.updated, key)); err != nil {
			return err
		}
	}
	if next.state == StateDone {
		return b.done.Put(journalTimeKey(next.updated, key), seq)
	}
	return nil
}

// remove deletes the entry of s, stored at seq, and its index records.
func (b journalTx) remove(seq []byte, s *journalState) error {
	// Copied before the first delete: s and seq alias memory that bbolt
	// lends, and its API promises nothing once the bucket has changed.
	pendingKey, doneKey := journalTimeKey(s.created, s.key), journalTimeKey(s.updated, s.key)
	key, op := bytes.Clone(s.key), bytes.Clone(s.operation)
	seq = bytes.Clone(seq)
	for _, d := range []struct {
		bucket *bolt.Bucket
		key    []byte
	}{{b.keys, key}, {b.states, seq}, {b.requests, seq}, {b.pending, pendingKey}, {b.done, doneKey}} {
		if err := d.bucket.Delete(d.key); err != nil {
			return err
		}
	}
	// The operation may have been begun again under another key since.
	if len(op) > 0 && bytes.Equal(b.ops.Get(op), key) {
		return b.ops.Delete(op)
	}
	return nil
}

// removeDamaged deletes the entry of key whose records do not decode,
// finding its index records by scanning, since its times and operation
// cannot be trusted. seq is where the key index points, nil if nowhere.
func (b journalTx) removeDamaged(key, seq []byte) error {
	key, seq = bytes.Clone(key), bytes.Clone(seq)
	if err := b.keys.Delete(key); err != nil {
		return err
	}
	if seq != nil {
		if err := b.states.Delete(seq); err != nil {
			return err
		}
		if err := b.requests.Delete(seq); err != nil {
			return err
		}
	}
	var doomed [][]byte
	for _, idx := range []*bolt.Bucket{b.pending, b.done} {
		doomed = doomed[:0]
		_ = idx.ForEach(func(k, v []byte) error {
			if len(k) > journalTimeKeyLen && bytes.Equal(k[journalTimeKeyLen:], key) || seq != nil && bytes.Equal(v, seq) {
				doomed = append(doomed, bytes.Clone(k))
			}
			return nil
		})
		for _, k := range doomed {
			if err := idx.Delete(k); err != nil {
				return err
			}
		}
	}
	doomed = doomed[:0]
	_ = b.ops.ForEach(func(op, k []byte) error {
		if bytes.Equal(k, key) {
			doomed = append(doomed, bytes.Clone(op))
		}
		return nil
	})
	for _, op := range doomed {
		if err := b.ops.Delete(op); err != nil {
			return err
		}
	}
	return nil
}

// journalCheckVersion checks the file's format version. A file without
// one is either not a journal or a version 1 journal, which kept its
// entries in a bucket named "entries" and had no version record.
func journalCheckVersion(tx *bolt.Tx) error {
	meta := tx.Bucket(journalMeta)
	if meta == nil {
		if tx.Bucket([]byte("entries")) != nil {
			return fmt.Errorf("%w: journal format version 1, this build reads version %d only: "+
				"finish or delete its pending entries with the build that wrote it, then start a new file",
				ErrJournalCorrupt, journalVersion)
		}
		return fmt.Errorf("%w: no format version: not an idemhttp journal", ErrJournalCorrupt)
	}
	v := meta.Get(journalVersionKey)
	if len(v) != 1 || v[0] != journalVersion {
		return fmt.Errorf("%w: journal format version %x, this build reads version %d", ErrJournalCorrupt, v, journalVersion)
	}
	return nil
}

// journalVerify checks the whole file; see [FileJournal.Verify]. It checks
// key order first: bbolt finds keys by binary search, so when a damaged
// page breaks the order, a lookup misses keys that iteration finds.
func journalVerify(ctx context.Context, tx *bolt.Tx) error {
	if err := journalCheckVersion(tx); err != nil {
		return err
	}
	if err := journalCheckPages(tx); err != nil {
		return err
	}
	b, err := journalBuckets(tx)
	if err != nil {
		return err
	}
	buckets := []*bolt.Bucket{b.keys, b.states, b.requests, b.ops, b.pending, b.done}
	for i, bucket := range buckets {
		if err := journalCheckOrder(journalBucketNames[i+1], bucket); err != nil {
			return err
		}
	}
	var entries, pending, done, withOp int
	var last uint64
	err = b.states.ForEach(func(seq, v []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if len(seq) != journalSeqLen {
			return fmt.Errorf("%w: states: %d-byte sequence number", ErrJournalCorrupt, len(seq))
		}
		last = journalSeqNum(seq)
		s, err := journalDecodeState(v)
		if err != nil {
			return fmt.Errorf("entry %s: %w", b.nameOf(seq), err)
		}
		entries++
		if !bytes.Equal(b.keys.Get(s.key), seq) {
			return fmt.Errorf("%w: entry %q is not where the key index points", ErrJournalCorrupt, s.key)
		}
		if _, err := b.withRequest(seq, &s); err != nil {
			return err
		}
		switch s.state {
		case StatePending:
			pending++
			if !bytes.Equal(b.pending.Get(journalTimeKey(s.created, s.key)), seq) {
				return fmt.Errorf("%w: pending entry %q missing from the pending index", ErrJournalCorrupt, s.key)
			}
		case StateDone:
			done++
			if !bytes.Equal(b.done.Get(journalTimeKey(s.updated, s.key)), seq) {
				return fmt.Errorf("%w: done entry %q missing from the done index", ErrJournalCorrupt, s.key)
			}
		}
		if len(s.operation) > 0 {
			withOp++
			if !bytes.Equal(b.ops.Get(s.operation), s.key) {
				return fmt.Errorf("%w: entry %q: operation %q does not map to it", ErrJournalCorrupt, s.key, s.operation)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if next := b.requests.Sequence(); next < last {
		// Begin would draw a number in use; it checks, but the file is
		// damaged all the same.
		return fmt.Errorf("%w: sequence %d is behind entry %d", ErrJournalCorrupt, next, last)
	}
	// Every entry was found in its indexes above, so equal counts mean the
	// indexes hold nothing else: no record pointing to a missing entry, or
	// to an entry in another state.
	for _, c := range []struct {
		name   string
		bucket *bolt.Bucket
		want   int
	}{{"keys", b.keys, entries}, {"requests", b.requests, entries}, {"pending", b.pending, pending}, {"done", b.done, done}, {"operations", b.ops, withOp}} {
		if n := c.bucket.Stats().KeyN; n != c.want {
			return fmt.Errorf("%w: %s bucket holds %d records for %d entries", ErrJournalCorrupt, c.name, n, c.want)
		}
	}
	return nil
}

// journalCheckPages checks that no page claims to run past the end of the
// file. bbolt trusts each page header's overflow count (how many pages
// follow a page that holds a large node, or a long freelist) and frees
// that many pages one by one when a commit replaces the page: a damaged
// count of a billion would hang the first write that touches the page, the
// freelist's included, and exhaust memory.
//
// The walk goes from run to run: a page in use is followed by its overflow
// pages, whose contents are not headers, then by the next run or a free
// page.
func journalCheckPages(tx *bolt.Tx) error {
	end := int(tx.Size() / int64(tx.DB().Info().PageSize))
	for id := 2; id < end; { // 0 and 1 are the meta pages
		p, err := tx.Page(id)
		if err != nil {
			return err
		}
		if p == nil {
			break
		}
		if p.Type == "free" {
			id++
			continue
		}
		if p.OverflowCount < 0 || p.OverflowCount >= end-id {
			return fmt.Errorf("%w: page %d (%s) claims %d overflow pages, the file ends at page %d", ErrJournalCorrupt, id, p.Type, p.OverflowCount, end)
		}
		id += p.OverflowCount + 1
	}
	return nil
}

// nameOf names the entry at seq for an error message: by its key, found by
// scanning the key index (the entry's own records being damaged), or by
// its number.
func (b journalTx) nameOf(seq []byte) string {
	name := fmt.Sprintf("%d", journalSeqNum(seq))
	_ = b.keys.ForEach(func(k, v []byte) error {
		if bytes.Equal(v, seq) {
			name = fmt.Sprintf("%q", k)
			return errors.New("found")
		}
		return nil
	})
	return name
}

// journalCheckOrder checks that a bucket's keys are strictly increasing:
// bbolt finds keys by binary search, so a key out of order is invisible to
// Get even though ForEach returns it.
func journalCheckOrder(name []byte, bucket *bolt.Bucket) error {
	var prev []byte
	return bucket.ForEach(func(k, _ []byte) error {
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return fmt.Errorf("%w: bucket %s: key %q after %q", ErrJournalCorrupt, name, k, prev)
		}
		prev = k
		return nil
	})
}
