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

// The file's layout: four top-level bbolt buckets. Entries are the truth;
// the other three are indexes that every write keeps in step within the
// same transaction, and that journalVerify checks against the entries.

// Bucket names. The index buckets hold no values: their keys carry the
// order, so Pending and Prune read only what they return.
var (
	journalEntries = []byte("entries")    // key -> encoded Entry
	journalOps     = []byte("operations") // operation -> key
	journalPending = []byte("pending")    // created time + key, for entries in state pending
	journalDone    = []byte("done")       // updated time + key, for entries in state done

	journalBucketNames = [][]byte{journalEntries, journalOps, journalPending, journalDone}
)

// journalTimeKeyLen is the length of the time prefix in index keys.
const journalTimeKeyLen = 12

// journalMark is the value of every index record. Not nil: within a write
// transaction bbolt's Get returns a nil-valued record as nil, the same as
// an absent one.
var journalMark = []byte{1}

// journalTimeKey is an index key: t as 8 bytes of Unix seconds with the
// sign bit flipped and 4 bytes of nanoseconds, big endian so that byte
// order is time order (before 1970 too), then the entry's key.
func journalTimeKey(t time.Time, key string) []byte {
	b := make([]byte, journalTimeKeyLen, journalTimeKeyLen+len(key))
	binary.BigEndian.PutUint64(b, uint64(t.Unix())^(1<<63))
	binary.BigEndian.PutUint32(b[8:], uint32(t.Nanosecond()))
	return append(b, key...)
}

// journalTx is the journal's buckets within one transaction.
type journalTx struct {
	entries, ops, pending, done *bolt.Bucket
}

func journalBuckets(tx *bolt.Tx) (journalTx, error) {
	b := journalTx{
		entries: tx.Bucket(journalEntries),
		ops:     tx.Bucket(journalOps),
		pending: tx.Bucket(journalPending),
		done:    tx.Bucket(journalDone),
	}
	if b.entries == nil || b.ops == nil || b.pending == nil || b.done == nil {
		return b, fmt.Errorf("%w: a bucket is missing", ErrJournalCorrupt)
	}
	return b, nil
}

// get decodes the entry stored under key.
func (b journalTx) get(key []byte) (*Entry, error) {
	v := b.entries.Get(key)
	if v == nil {
		return nil, ErrNotFound
	}
	return journalDecodeStored(key, v)
}

// journalDecodeStored decodes the entry v stored under key k.
func journalDecodeStored(k, v []byte) (*Entry, error) {
	e, err := journalDecodeEntry(v)
	if err != nil {
		return nil, fmt.Errorf("entry %q: %w", k, err)
	}
	if e.Key != string(k) {
		return nil, fmt.Errorf("%w: entry stored under %q holds key %q", ErrJournalCorrupt, k, e.Key)
	}
	return e, nil
}

// indexed returns the entry an index record k points to, checking that
// the entry agrees with the index.
func (b journalTx) indexed(k []byte, want State) (*Entry, error) {
	if len(k) <= journalTimeKeyLen {
		return nil, fmt.Errorf("%w: %s index record of %d bytes", ErrJournalCorrupt, want, len(k))
	}
	e, err := b.get(k[journalTimeKeyLen:])
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: %s index points to missing entry %q", ErrJournalCorrupt, want, k[journalTimeKeyLen:])
	}
	if err != nil {
		return nil, err
	}
	t := e.Created
	if want == StateDone {
		t = e.Updated
	}
	if e.State != want || !bytes.Equal(journalTimeKey(t, e.Key), k) {
		return nil, fmt.Errorf("%w: %s index disagrees with entry %q", ErrJournalCorrupt, want, e.Key)
	}
	return e, nil
}

// reindex moves an entry's index records from its previous to its new
// state and times.
func (b journalTx) reindex(prev, e *Entry) error {
	if prev.State == StatePending && e.State != StatePending {
		if err := b.pending.Delete(journalTimeKey(prev.Created, prev.Key)); err != nil {
			return err
		}
	}
	if e.State == StatePending {
		if err := b.pending.Put(journalTimeKey(e.Created, e.Key), journalMark); err != nil {
			return err
		}
	}
	if prev.State == StateDone {
		if err := b.done.Delete(journalTimeKey(prev.Updated, prev.Key)); err != nil {
			return err
		}
	}
	if e.State == StateDone {
		return b.done.Put(journalTimeKey(e.Updated, e.Key), journalMark)
	}
	return nil
}

// remove deletes e and its index records.
func (b journalTx) remove(e *Entry) error {
	if err := b.entries.Delete([]byte(e.Key)); err != nil {
		return err
	}
	// The operation may have been begun again under another key since.
	if e.Operation != "" && bytes.Equal(b.ops.Get([]byte(e.Operation)), []byte(e.Key)) {
		if err := b.ops.Delete([]byte(e.Operation)); err != nil {
			return err
		}
	}
	if err := b.pending.Delete(journalTimeKey(e.Created, e.Key)); err != nil {
		return err
	}
	return b.done.Delete(journalTimeKey(e.Updated, e.Key))
}

// removeDamaged deletes an entry that does not decode, finding its index
// records by scanning, since its times and operation cannot be trusted.
func (b journalTx) removeDamaged(key []byte) error {
	if err := b.entries.Delete(key); err != nil {
		return err
	}
	var doomed [][]byte
	for _, idx := range []*bolt.Bucket{b.pending, b.done} {
		doomed = doomed[:0]
		_ = idx.ForEach(func(k, _ []byte) error {
			if len(k) > journalTimeKeyLen && bytes.Equal(k[journalTimeKeyLen:], key) {
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

// journalVerify checks the whole file; see [FileJournal.Verify]. It reads
// values from the cursors instead of looking keys up again: when a damaged
// page breaks key order, a lookup misses keys that iteration finds.
func journalVerify(ctx context.Context, tx *bolt.Tx) error {
	b, err := journalBuckets(tx)
	if err != nil {
		return err
	}
	for i, bucket := range []*bolt.Bucket{b.entries, b.ops, b.pending, b.done} {
		if err := journalCheckOrder(journalBucketNames[i], bucket); err != nil {
			return err
		}
	}
	var pending, done, withOp int
	err = b.entries.ForEach(func(k, v []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		e, err := journalDecodeStored(k, v)
		if err != nil {
			return err
		}
		switch e.State {
		case StatePending:
			pending++
			if b.pending.Get(journalTimeKey(e.Created, e.Key)) == nil {
				return fmt.Errorf("%w: pending entry %q missing from the pending index", ErrJournalCorrupt, e.Key)
			}
		case StateDone:
			done++
			if b.done.Get(journalTimeKey(e.Updated, e.Key)) == nil {
				return fmt.Errorf("%w: done entry %q missing from the done index", ErrJournalCorrupt, e.Key)
			}
		}
		if e.Operation != "" {
			withOp++
			if !bytes.Equal(b.ops.Get([]byte(e.Operation)), k) {
				return fmt.Errorf("%w: entry %q: operation %q does not map to it", ErrJournalCorrupt, e.Key, e.Operation)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Every entry was found in its indexes above, so equal counts mean the
	// indexes hold nothing else: no record pointing to a missing entry, or
	// to an entry in another state.
	for _, c := range []struct {
		name   string
		bucket *bolt.Bucket
		want   int
	}{{"pending", b.pending, pending}, {"done", b.done, done}, {"operations", b.ops, withOp}} {
		if n := c.bucket.Stats().KeyN; n != c.want {
			return fmt.Errorf("%w: %s index holds %d records for %d entries", ErrJournalCorrupt, c.name, n, c.want)
		}
	}
	return nil
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
