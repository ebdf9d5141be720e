package filejournal

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/wal"
)

// compactMin is the file size below which compaction is not worth it.
const compactMin = 1 << 20

// index is the in-memory state replay builds.
type index struct {
	byKey *table
	byOp  *table
	all   []*entry // in the order begun; deleted ones marked gone
	live  int64
	high  time.Time  // the latest time in any record: see Journal.high
	clk   clockState // from the witness records (and the index file): see Journal.Now

	scratch  []byte // indexBegin's, for the key and operation id
	fileSize int64  // of the file replayed, 0 if not known
}

// raiseParts raises idx.high to the time the file stores as sec and ns,
// if later.
func (idx *index) raiseParts(sec int64, ns uint32) {
	if t := unixTime(sec, ns); t.After(idx.high) {
		idx.high = t
	}
}

// estimateAfter is how many begin records replay reads before it
// estimates how many the file holds, from the bytes they took, and sizes
// the tables for that many.
const estimateAfter = 1 << 16

func newFjIndex() *index {
	return &index{byKey: newFjTable(false, 0), byOp: newFjTable(true, 0)}
}

// applyRecord is the [wal.ApplyFunc] that builds the index. Begin
// records, nearly all of a file, are read for the fields the index keeps
// only, without allocating the request: opening a journal of a million
// entries is mostly this. The request's fields are checked when the entry
// is read back (Get, Pending, Resume) and by Verify, which decode it in
// full: a header out of order, say, is found there, not here. With
// digest as the replay's [wal.DigestFunc], a begin record arrives as
// its digest, made on the read-ahead's goroutine.
func (idx *index) applyRecord(off int64, n int, payload []byte) error {
	if len(payload) > 0 {
		switch payload[0] {
		case kindBegin:
			b, err := scanBegin(payload)
			if err != nil {
				return err
			}
			return idx.indexBegin(off, n, &b)
		case kindDigest:
			b, err := undigest(payload)
			if err != nil {
				return err
			}
			return idx.indexBegin(off, n, &b)
		}
	}
	rec, err := decodeRecord(payload)
	if err != nil {
		return err
	}
	return idx.apply(rec, off, n)
}

// verifyRecord is applyRecord decoding every record in full, for Verify
// (and the tests, which check that both accept the same files).
func (idx *index) verifyRecord(off int64, n int, payload []byte) error {
	rec, err := decodeRecord(payload)
	if err != nil {
		return err
	}
	return idx.apply(rec, off, n)
}

// begin is what the index keeps of a begin record. key and op alias
// the record (or its digest).
type begin struct {
	key, op                []byte
	keyOp                  []byte // key then op, when adjacent (a digest's); nil otherwise
	createdSec, updatedSec int64
	createdNs, updatedNs   uint32
	state                  byte
	attempts, lastStatus   int
}

// scanBegin reads a begin record for the fields the index keeps,
// skipping the request's, and checks it as far as a full decode would
// refuse it.
func scanBegin(payload []byte) (begin, error) {
	var b begin
	r := journalReader{b: payload[1:]}
	b.key = r.bytes()
	b.op = r.bytes()
	r.bytes() // method
	r.bytes() // URL
	r.bytes() // fingerprint
	// Header names in order, each with a value, as decodeRecord
	// requires: the index accepts no record a full decode refuses.
	var prev []byte
	for i := range r.count() {
		name := r.bytes()
		vals := r.count()
		for range vals {
			r.bytes() // value
		}
		if r.err != nil {
			break
		}
		if (i > 0 && bytes.Compare(name, prev) <= 0) || vals == 0 {
			r.fail("header %q out of order, repeated or empty", name)
			break
		}
		prev = name
	}
	b.createdSec, b.createdNs = r.timeParts()
	b.updatedSec, b.updatedNs = r.timeParts()
	b.state = r.state()
	b.attempts = r.int()
	b.lastStatus = r.int()
	switch r.byte() {
	case 0:
	case 1:
		r.bytes()
	default:
		r.fail("bad body flag")
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return b, r.err
	}
	if b.attempts < 0 {
		return b, fmt.Errorf("%w: negative attempts %d", ErrCorrupt, b.attempts)
	}
	if err := contract.ValidateKey(b.key); err != nil {
		return b, fmt.Errorf("%w: record with a bad key", ErrCorrupt)
	}
	return b, nil
}

// kindDigest starts the digest of a begin record: never a record's
// kind in a file (digest refuses a record of that kind, as a full
// decode does, so that none passes for a digest).
const kindDigest = 'b'

// digestLen is the fixed part of a digest: its kind, then created and
// updated seconds, attempts and last status (8 bytes each), created and
// updated nanoseconds (4 each), the key's length (2) and the operation
// id's (4), and the state; the key and the operation id follow.
const digestLen = 1 + 4*8 + 2*4 + 2 + 4 + 1

// digest is the [wal.DigestFunc] of a journal's replay: a begin record
// becomes the few dozen bytes of it the index keeps, checked as
// applyRecord checks it (scanBegin); any other record stays as it is.
// It runs on the read-ahead's goroutine while the records before are
// indexed, so that opening a large journal checks and reads its records
// on one core and indexes them on another: the index then reads a
// compact digest instead of the first cache lines of every 1 KiB record,
// at fixed offsets, the applier being the busier of the two.
// It must not touch the index.
func digest(dst, payload []byte) ([]byte, error) {
	if len(payload) == 0 || payload[0] != kindBegin {
		if len(payload) > 0 && payload[0] == kindDigest {
			_, err := decodeRecord(payload) // an unknown kind, as Verify says
			return dst, err
		}
		return append(dst, payload...), nil
	}
	b, err := scanBegin(payload)
	if err != nil {
		return dst, err
	}
	le := binary.LittleEndian
	dst = append(dst, kindDigest)
	dst = le.AppendUint64(dst, uint64(b.createdSec))
	dst = le.AppendUint64(dst, uint64(b.updatedSec))
	dst = le.AppendUint64(dst, uint64(b.attempts))
	dst = le.AppendUint64(dst, uint64(b.lastStatus))
	dst = le.AppendUint32(dst, b.createdNs)
	dst = le.AppendUint32(dst, b.updatedNs)
	dst = le.AppendUint16(dst, uint16(len(b.key))) // at most MaxKeyLen: scanBegin checked it
	dst = le.AppendUint32(dst, uint32(len(b.op)))  // within a record, below MaxRecord
	dst = append(dst, b.state)
	dst = append(dst, b.key...)
	return append(dst, b.op...), nil
}

// undigest reads what digest made.
func undigest(d []byte) (begin, error) {
	var b begin
	if len(d) < digestLen {
		return b, fmt.Errorf("%w: short digest", ErrCorrupt)
	}
	le := binary.LittleEndian
	kl, ol := int(le.Uint16(d[41:])), int(le.Uint32(d[43:]))
	if len(d)-digestLen != kl+ol {
		return b, fmt.Errorf("%w: digest of %d bytes for %d", ErrCorrupt, len(d), digestLen+kl+ol)
	}
	b.createdSec, b.updatedSec = int64(le.Uint64(d[1:])), int64(le.Uint64(d[9:]))
	b.attempts, b.lastStatus = int(int64(le.Uint64(d[17:]))), int(int64(le.Uint64(d[25:])))
	b.createdNs, b.updatedNs = le.Uint32(d[33:]), le.Uint32(d[37:])
	b.state = d[47]
	b.keyOp = d[digestLen:]
	b.key, b.op = b.keyOp[:kl], b.keyOp[kl:]
	return b, nil
}

// indexBegin indexes the begin record b, stored at off with length n.
func (idx *index) indexBegin(off int64, n int, b *begin) error {
	key, op := b.key, b.op
	// One allocation for the key and the operation id together.
	keyOp := b.keyOp
	if keyOp == nil {
		idx.scratch = append(append(idx.scratch[:0], key...), op...)
		keyOp = idx.scratch
	}
	le := &entry{
		keyOp: string(keyOp), keyLen: uint16(len(key)), attempts: b.attempts, lastStatus: b.lastStatus, state: b.state, off: off, size: int32(n),
		createdSec: b.createdSec, createdNs: b.createdNs, updatedSec: b.updatedSec, updatedNs: b.updatedNs,
	}
	if len(idx.all) == estimateAfter && idx.fileSize > off {
		// Grow the tables once to what the whole file will hold at this
		// rate, instead of doubling every shard again and again.
		est := int(int64(len(idx.all)) * idx.fileSize / off)
		idx.byKey.reserve(est)
		if len(op) > 0 {
			idx.byOp.reserve(est)
		}
		idx.all = slices.Grow(idx.all, est-len(idx.all))
	}
	if idx.byKey.insertNew(idx.byKey.hashBytes(key), le) != nil {
		return fmt.Errorf("%w: key %q stored twice", ErrCorrupt, key)
	}
	if len(op) > 0 && idx.byOp.insertNew(idx.byOp.hashBytes(op), le) != nil {
		idx.byKey.del(le.key()) // a salvage goes on without it
		return fmt.Errorf("%w: operation %q stored twice", ErrCorrupt, op)
	}
	idx.all = append(idx.all, le)
	idx.live += int64(n) + entryOverhead
	idx.raiseParts(b.createdSec, b.createdNs)
	idx.raiseParts(b.updatedSec, b.updatedNs)
	return nil
}

// apply applies one record, stored at off with length n, to the index.
func (idx *index) apply(rec *record, off int64, n int) error {
	switch rec.kind {
	case kindClock:
		// The mark when the file was compacted: deleted entries' times
		// count too (see Journal.HighWater).
		idx.high = contract.Latest(idx.high, rec.updated)
		return nil
	case kindWitness:
		idx.clk.merge(rec.clk)
		return nil
	}
	le := idx.byKey.get(rec.key)
	exists := le != nil
	switch rec.kind {
	case kindResult, kindParked:
		if exists {
			// A done entry's result, or a pending entry's not-before: the
			// record replaces the entry's earlier one, request and all.
			idx.live += int64(n) - int64(le.size)
			le.off, le.size = off, int32(n)
			le.setOutcome(rec.state, rec.lastStatus, rec.attempts, rec.updated)
			break
		}
		fallthrough // a compacted file's: the entry's only record
	case kindBegin:
		if exists {
			return fmt.Errorf("%w: key %q stored twice", ErrCorrupt, rec.key)
		}
		if rec.operation != "" {
			if idx.byOp.get(rec.operation) != nil {
				return fmt.Errorf("%w: operation %q stored twice", ErrCorrupt, rec.operation)
			}
		}
		le := newFjEntry(rec.key, rec.operation, rec.created, rec.updated, rec.attempts, rec.lastStatus, rec.state, off, n)
		idx.byKey.put(le)
		idx.all = append(idx.all, le)
		if le.operation() != "" {
			idx.byOp.put(le)
		}
		idx.live += int64(n) + entryOverhead
	case kindFinish:
		if !exists {
			return fmt.Errorf("%w: outcome of unknown key %q", ErrCorrupt, rec.key)
		}
		le.setOutcome(rec.state, rec.lastStatus, rec.attempts, rec.updated)
	case kindDelete:
		if !exists {
			return fmt.Errorf("%w: deletion of unknown key %q", ErrCorrupt, rec.key)
		}
		idx.byKey.del(rec.key)
		le.gone = true
		if le.operation() != "" {
			idx.byOp.del(le.operation())
		}
		idx.live -= int64(le.size) + entryOverhead
	}
	idx.high = contract.Latest(idx.high, rec.created, rec.updated)
	return nil
}

// verify replays the durable part of the file and compares it with the
// index.
func (j *Journal) verify(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return j.log.View(func(r wal.Reader) error {
		// Durable entries, as of this instant: commits publish under mu,
		// and a rewrite waits for View to end.
		type place struct {
			off  int64
			size int32
		}
		j.mu.Lock()
		size := j.durable
		want := make(map[string]place, j.byKey.len())
		// A read-only journal's index is the file's as it was opened,
		// nothing newer: all of it can be compared, which finds an index
		// file that disagrees with the records (see Journal). A
		// writer's entries may hold outcomes not on disk yet.
		var states map[string]stateView
		high := j.high
		if j.readOnly {
			states = make(map[string]stateView, j.byKey.len())
		}
		for le := range j.byKey.all() {
			if !le.unsynced {
				off, size := j.placeLocked(le)
				want[le.key()] = place{off, size}
				if states != nil {
					states[le.key()] = stateOf(le)
				}
			}
		}
		j.mu.Unlock()
		if skipped := r.Skipped(); skipped > 0 {
			return fmt.Errorf("%w: %d damaged bytes were skipped when the journal was opened", ErrCorrupt, skipped)
		}
		idx := newFjIndex()
		res, err := r.Replay(size, idx.verifyRecord)
		if err != nil {
			return err
		}
		if res.Truncated > 0 {
			return fmt.Errorf("%w: damaged batch at offset %d, inside data already on disk", ErrCorrupt, res.End)
		}
		for le := range idx.byKey.all() {
			k := le.key()
			p, ok := want[k]
			if !ok {
				return fmt.Errorf("%w: entry %s is in the file but not in the index", ErrCorrupt, k)
			}
			if p.off != le.off || p.size != le.size {
				return fmt.Errorf("%w: entry %s is at offset %d in the file, %d in the index", ErrCorrupt, k, le.off, p.off)
			}
			if st, ok := states[k]; ok && st != stateOf(le) {
				return fmt.Errorf("%w: entry %s: its state, times or counts in the file are not the index's", ErrCorrupt, k)
			}
		}
		if states != nil && !idx.high.Equal(high) {
			return fmt.Errorf("%w: the file's high-water mark is %v, the index's %v", ErrCorrupt, idx.high, high)
		}
		for k := range want {
			if idx.byKey.get(k) == nil {
				return fmt.Errorf("%w: entry %s is in the index but not in the file", ErrCorrupt, k)
			}
		}
		return nil
	})
}

// stateView is what Verify compares of an entry besides its place:
// the fields records set, and the operation id.
type stateView struct {
	keyOp                  string
	createdSec, updatedSec int64
	createdNs, updatedNs   uint32
	attempts, lastStatus   int
	state                  byte
}

func stateOf(le *entry) stateView {
	return stateView{
		keyOp: le.keyOp, createdSec: le.createdSec, updatedSec: le.updatedSec, createdNs: le.createdNs, updatedNs: le.updatedNs,
		attempts: le.attempts, lastStatus: le.lastStatus, state: le.state,
	}
}

// worthCompacting reports whether compaction would at least halve a file
// of at least compactMin bytes.
func (j *Journal) worthCompacting() bool {
	size := j.log.Size()
	j.mu.Lock()
	live := j.live
	j.mu.Unlock()
	return wal.CanRewrite && size >= compactMin && size > 2*(live+wal.FileHeaderLen)
}

// maybeCompact compacts the file if that is worthwhile.
func (j *Journal) maybeCompact(ctx context.Context) error {
	if !j.worthCompacting() {
		return nil
	}
	return j.Compact(ctx)
}

// Compact rewrites the journal file with only its live entries, each as
// one record holding its current state, and replaces the old file with it
// atomically: the new file is written beside the old one, synced, and
// renamed over it, so a crash at any point leaves one or the other whole.
// A journal path that is a symbolic link stays one: the new file replaces
// the link's target. Prune and Open call Compact when it would
// halve the file.
//
// Compact reads and rewrites every live entry while the journal works
// on: Begin, Finish, Get and the rest are not held up while it does.
// Its writes are pushed to the disk a MiB at a time as it goes, so that
// a commit's sync never queues behind much of them. Then it copies the
// batches committed meanwhile, in rounds, and holds writers up only for
// the last round, the final sync, the rename and the switch of the index
// to the new file, which touches only what changed during the rewrite:
// the entries it rewrote take their new places afterwards, a chunk at a
// time (a millisecond or two in all at a million entries; the old file
// is closed, and freed, after writers go on). If the directory cannot be
// synced after the rename, the journal stops taking writes (see
// [Journal]). On Windows, which cannot rename over an open file,
// Compact returns an error and the file only grows until its done entries
// are pruned and a new journal is started.
func (j *Journal) Compact(ctx context.Context) error {
	if err := j.compact(ctx); err != nil {
		return fmt.Errorf("idemhttp: journal compact: %w", err)
	}
	return nil
}

func (j *Journal) compact(ctx context.Context) error {
	// The swap replaces the list a scan walks: not during one.
	j.scanMu.Lock()
	defer j.scanMu.Unlock()
	// What the old file holds up to from: every entry durable then, with
	// where its begin record is.
	var all []place
	var byKey, byOp *table
	var list []*entry
	switched := false
	// The index file of the new file, as of the last batch of records
	// fill writes (the batches copied after it are replayed onto it): a
	// crash after the compaction then opens from it.
	var xw *indexWriter
	var xcp wal.Checkpoint
	var xhigh time.Time
	var xclk clockState
	defer func() {
		if xw != nil {
			xw.abort()
		}
	}()
	fill := func(r wal.Reader, w *wal.Writer) (int64, error) {
		j.mu.Lock()
		from := j.durable
		listed := len(j.all)
		// Entries published from here on are in batches the rewrite
		// copies as they are: their offsets move with them. Entries
		// deleted from here on are marked goneLate.
		j.compacting, j.moved, j.lateGone = true, nil, nil
		j.mu.Unlock()
		// Every entry durable at from is in the list (which only grows
		// while scanMu is held), begun before from; those deleted since
		// are still wanted: the delete record, in a batch copied after,
		// must find its entry. The list is read a chunk at a time, so
		// that Begin is never held up for long.
		all = make([]place, 0, listed)
		for i := 0; i < listed; i += removeChunk {
			j.mu.Lock()
			for _, le := range j.all[i:min(i+removeChunk, listed)] {
				if le.off < from && !le.unsynced && (!le.gone || le.goneLate) {
					all = append(all, place{le: le, off: le.off, size: le.size})
				}
			}
			j.mu.Unlock()
			if i == 0 && j.hook != nil {
				j.hook("snapshot")
			}
		}
		j.mu.Lock()
		high := j.high
		live := j.live
		j.mu.Unlock()
		if !j.salvage && live >= indexMin {
			xw, _ = j.newIndexWriter(true) // best effort, as at Close
		}
		// The index file's mark is what replay would make of the new
		// file up to its checkpoint: the clock record's, raised by the
		// records' own times.
		xhigh = high
		// The mark first: the records it was taken from may not be
		// copied (see HighWater); later batches can only raise it.
		if _, err := w.Append(clockMax, func(buf []byte) []byte { return appendClock(buf, high) }); err != nil {
			return 0, err
		}
		// And the clock's state, which the records it was kept in,
		// left behind, no longer hold.
		j.clockMu.Lock()
		witness := appendWitness(nil, &j.clk)
		xclk = j.clk
		j.clockMu.Unlock()
		if _, err := w.Append(len(witness), func(buf []byte) []byte { return append(buf, witness...) }); err != nil {
			return 0, err
		}
		// Key, operation and created time never change: sorting and new
		// tables need no lock.
		slices.SortFunc(all, func(a, b place) int {
			return compareCreated(a.le, b.le)
		})
		// Tables never shrink below their peak by themselves as much as
		// a new one sized to what is live: build new ones for the swap.
		byKey, byOp = newFjTable(false, len(all)), newFjTable(true, 0)
		for i := range all {
			le := all[i].le
			byKey.put(le)
			if le.operation() != "" {
				byOp.put(le)
			}
		}
		// Each entry's state is read under mu, and its slot in all set,
		// an entry at a time, so that Begin is never held up for long.
		var rbuf []byte
		var e *idemhttp.Entry
		for i := range all {
			if i%1024 == 0 {
				if err := ctx.Err(); err != nil {
					return 0, err
				}
			}
			le := all[i].le
			snap := entry{keyOp: le.keyOp, keyLen: le.keyLen, off: all[i].off, size: all[i].size}
			j.mu.Lock()
			gone := le.gone
			if !gone {
				snap.createdSec, snap.createdNs, snap.updatedSec, snap.updatedNs = le.createdSec, le.createdNs, le.updatedSec, le.updatedNs
				snap.attempts, snap.lastStatus, snap.state = le.attempts, le.lastStatus, le.state
			}
			le.slot = int32(i)
			j.mu.Unlock()
			var err error
			if e, err = readEntry(r, &snap, rbuf); err != nil {
				return 0, err
			}
			if gone {
				// Deleted since: any state will do, the delete follows.
				e.State = idemhttp.StateDone
			}
			size, names := beginSize(e)
			var encErr error
			var n int
			off, err := w.Append(recHdrLen+size, func(buf []byte) []byte {
				start := len(buf)
				buf, encErr = appendBeginSized(buf, e, size, names)
				n = len(buf) - start
				return buf
			})
			if err != nil {
				return 0, err
			}
			if encErr != nil {
				return 0, encErr
			}
			all[i].newOff, all[i].newSize = off, int32(n)
			if xw != nil {
				// The entry as replay will index the record just written:
				// appendBegin stores e's fields as they are (and refused
				// a state it does not know).
				st, _ := journalStateByte(e.State)
				ie := entryOf(le.keyOp, le.keyLen, e.Created, e.Updated, e.Attempts, e.LastStatus, st, off, n)
				xw.add(&ie, off, int32(n))
				xhigh = contract.Latest(xhigh, e.Created, e.Updated)
			}
		}
		if xw != nil {
			cp, err := w.Checkpoint()
			if err != nil {
				return 0, err
			}
			xcp = cp
		}
		// The list the swap installs, built here, outside the lock: an
		// entry deleted from now on stays in it, marked gone, as the
		// list allows.
		list = make([]*entry, 0, len(all))
		for i := range all {
			list = append(list, all[i].le)
		}
		return from, nil
	}
	// swap runs with writers held up: it does only what changed since
	// the snapshot, and leaves the entries of all behind the new
	// generation, for the fix-up below.
	swap := func(move func() int64) {
		j.mu.Lock()
		defer j.mu.Unlock()
		delta := move()
		switched = true
		for _, le := range j.lateGone {
			// Deleted since the snapshot: out of the new tables too.
			if byKey.get(le.key()) == le {
				byKey.del(le.key())
			}
			if le.operation() != "" && byOp.get(le.operation()) == le {
				byOp.del(le.operation())
			}
		}
		j.gen++
		j.remap = all
		// Batches committed since, and the one being filled, moved as a
		// whole; their entries join the new tables.
		keep := func(le *entry) {
			le.off += delta
			le.gen = j.gen
			if !le.gone {
				byKey.put(le)
				if le.operation() != "" {
					byOp.put(le)
				}
			}
		}
		for _, le := range j.moved {
			keep(le)
			list = append(list, le)
		}
		for _, p := range j.pend {
			for _, le := range p.begins {
				keep(le)
				list = append(list, le)
			}
		}
		j.byKey, j.byOp, j.all = byKey, byOp, list
		j.endCompactingLocked()
		j.durable = j.log.Size()
	}
	err := j.log.Rewrite(ctx, fill, swap)
	if err != nil {
		j.mu.Lock()
		if j.compacting {
			j.endCompactingLocked()
		}
		j.mu.Unlock()
	}
	if err == nil && switched && xw != nil {
		// The new file is in place (the old index file names the old
		// salt: no open uses it any more).
		if xw.finish(xcp, xhigh, &xclk) != nil {
			_ = j.fs.Remove(j.indexPath)
		}
		xw = nil
	}
	if switched {
		if j.hook != nil {
			j.hook("switched")
		}
		// Writers go on; the entries of the old file are brought to the
		// new one's places a chunk at a time. Until then placeLocked
		// finds them through remap.
		for i := 0; i < len(all); i += removeChunk {
			j.mu.Lock()
			for k := i; k < min(i+removeChunk, len(all)); k++ {
				p := &all[k]
				if le := p.le; le.gen != j.gen {
					if !le.gone {
						j.live += int64(p.newSize) - int64(le.size)
					}
					le.off, le.size, le.gen = p.newOff, p.newSize, j.gen
				}
			}
			j.mu.Unlock()
		}
		j.mu.Lock()
		j.remap = nil
		j.mu.Unlock()
	}
	return err
}

// endCompactingLocked ends what a compaction's snapshot started.
func (j *Journal) endCompactingLocked() {
	for _, le := range j.lateGone {
		le.goneLate = false
	}
	j.compacting, j.moved, j.lateGone = false, nil, nil
}
