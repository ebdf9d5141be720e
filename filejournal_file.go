package idemhttp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
)

// fjCompactMin is the file size below which compaction is not worth it.
const fjCompactMin = 1 << 20

// fjMaxPooledBuf bounds the batch buffers kept for reuse, so that one
// batch of huge bodies does not pin its memory for the process's life.
const fjMaxPooledBuf = 8 << 20

// fjBufs is a pool of batch and encoding buffers. The zero value is
// ready to use.
type fjBufs struct{ p sync.Pool }

func (p *fjBufs) Get() *[]byte {
	if b, ok := p.p.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 64<<10)
	return &b
}

func (p *fjBufs) Put(b *[]byte) {
	if cap(*b) <= fjMaxPooledBuf {
		p.p.Put(b)
	}
}

// fjOpenLocked opens path with mode 0600, takes its lock without
// waiting, and tightens the mode of an existing file.
//
// A lock is taken on an open file, and compaction renames a new file over
// the path: a process that opened the old file just before the rename
// could lock it after its owner let go, and write to a file nobody will
// read again. So the locked file must still be the one the path names;
// if not, it is opened again.
func fjOpenLocked(path string, flag int) (*os.File, error) {
	for range 10 {
		f, err := os.OpenFile(path, flag, 0o600)
		if err != nil {
			return nil, err
		}
		if err := fjLock(f); err != nil {
			_ = f.Close()
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		if now, err := os.Stat(path); err != nil || !os.SameFile(fi, now) {
			_ = f.Close() // replaced since it was opened: try the new one
			continue
		}
		if fi.Mode().Perm()&0o077 != 0 {
			if err := f.Chmod(0o600); err != nil {
				_ = f.Close()
				return nil, err
			}
		}
		return f, nil
	}
	return nil, ErrJournalLocked // replaced ten times over: someone else is busy with it
}

// fjIndex is the in-memory state replay builds.
type fjIndex struct {
	byKey     map[string]*fjEntry
	byOp      map[string]string
	salt      uint64 // the file's, from its header
	live      int64
	seq       uint64 // the last batch's sequence number, 0 if none
	end       int64  // where the valid batches end
	truncated int64  // torn tail after end
	skipped   int64  // damaged batches skipped (salvage only)
}

// open opens, locks and replays the journal file, creating it if needed,
// cuts off a torn tail, and compacts the file when worthwhile.
func (j *FileJournal) open() error {
	f, err := fjOpenLocked(j.path, os.O_RDWR|os.O_CREATE|fjSyncFlag)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		_ = f.Close()
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	size := fi.Size()
	if size < fjFileHdrLen {
		if size, err = fjInitFile(f, j.path, size); err != nil {
			return fail(err)
		}
	}
	idx, err := fjReplayFrom(f, size, j.salvage)
	if err != nil {
		return fail(err)
	}
	if idx.truncated > 0 {
		if err := f.Truncate(idx.end); err != nil {
			return fail(err)
		}
		if err := fjDatasync(f); err != nil {
			return fail(err)
		}
	}
	// A compaction that a crash interrupted before its rename leaves its
	// temporary file; the journal itself is the old file, intact. Only
	// now, with the lock held, is no other process compacting.
	if err := os.Remove(j.path + fjCompactSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	j.f = f
	j.byKey, j.byOp, j.live, j.seq, j.salt = idx.byKey, idx.byOp, idx.live, idx.seq, idx.salt
	j.pending = 0
	for _, le := range j.byKey {
		if le.state == journalStatePending {
			j.pending++
		}
	}
	j.truncated, j.skipped = idx.truncated, idx.skipped
	j.size.Store(idx.end)
	j.cur = j.newBatchLocked(idx.end)
	if !j.salvage && j.worthCompacting() {
		// Best effort: a failed compaction leaves the file as it was,
		// a valid journal, and a later Prune tries again.
		_ = j.Compact(context.Background())
	}
	return nil
}

// fjInitFile writes the header of a new journal into f, of size bytes
// (fewer than a header), and returns the file's new size. A file that
// short is empty, or holds a header whose write a crash cut short; the
// salt is random, so only the magic and the version of a short header can
// be compared. Anything else is not a journal, and is refused.
func fjInitFile(f *os.File, path string, size int64) (int64, error) {
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil {
		return 0, err
	}
	var want [12]byte
	copy(want[:], fjFileMagic[:])
	binary.LittleEndian.PutUint32(want[8:], fjVersion)
	if !bytes.HasPrefix(want[:], data[:min(len(data), len(want))]) {
		_, err := fjCheckFileHeader(data)
		return 0, err
	}
	salt, err := fjNewSalt()
	if err != nil {
		return 0, err
	}
	hdr := fjFileHeader(salt)
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return 0, err
	}
	if err := fjDatasync(f); err != nil {
		return 0, err
	}
	if err := fjSyncDir(path); err != nil {
		return 0, err
	}
	return int64(len(hdr)), nil
}

// worthCompacting reports whether compaction would at least halve a file
// of at least fjCompactMin bytes.
func (j *FileJournal) worthCompacting() bool {
	size := j.size.Load()
	j.mu.Lock()
	live := j.live
	j.mu.Unlock()
	return fjCanCompact && size >= fjCompactMin && size > 2*(live+fjFileHdrLen)
}

// maybeCompact compacts the file if that is worthwhile.
func (j *FileJournal) maybeCompact(ctx context.Context) error {
	if !j.worthCompacting() {
		return nil
	}
	return j.Compact(ctx)
}

// fjReplay rebuilds the index from a journal file's bytes, header
// included. With salvage, damage in the middle of the file is skipped
// instead of refused.
func fjReplay(data []byte, salvage bool) (*fjIndex, error) {
	return fjReplayFrom(bytes.NewReader(data), int64(len(data)), salvage)
}

// fjReplayFrom is fjReplay reading the first size bytes of r a batch at a
// time, so that opening a journal takes memory for its index and its
// largest batch, not for the whole file.
func fjReplayFrom(r io.ReaderAt, size int64, salvage bool) (*fjIndex, error) {
	hdr := make([]byte, min(size, fjFileHdrLen))
	if _, err := r.ReadAt(hdr, 0); err != nil {
		return nil, err
	}
	salt, err := fjCheckFileHeader(hdr)
	if err != nil {
		return nil, err
	}
	idx := &fjIndex{byKey: make(map[string]*fjEntry), byOp: make(map[string]string), salt: salt}
	rd := &fjBatchReader{r: r, size: size, salt: salt}
	off := int64(fjFileHdrLen)
	for off < size {
		seq, records, n, ok, err := rd.batchAt(off)
		if err != nil {
			return nil, err
		}
		if ok && idx.seq != 0 && seq != idx.seq+1 {
			if !salvage {
				return nil, fmt.Errorf("%w: batch at offset %d has sequence number %d, want %d", ErrJournalCorrupt, off, seq, idx.seq+1)
			}
			// Intact but out of place (a gap, or an old number): its
			// records may refer to batches that are gone. Skip it, and
			// take the next batch's number as it comes.
			idx.skipped += int64(n)
			idx.seq = 0
			off += int64(n)
			continue
		}
		if !ok {
			next, err := rd.find(off+1, idx.seq)
			if err != nil {
				return nil, err
			}
			if next < 0 {
				// Nothing valid follows: a group commit the crash cut
				// short, never acknowledged.
				idx.truncated = size - off
				break
			}
			if !salvage {
				return nil, fmt.Errorf("%w: damaged batch at offset %d, followed by a valid one at offset %d", ErrJournalCorrupt, off, next)
			}
			idx.skipped += next - off
			idx.seq = 0 // accept the next batch's number, whatever it is
			off = next
			continue
		}
		if err := idx.applyBatch(records, off+fjBatchHdrLen, salvage); err != nil {
			return nil, fmt.Errorf("batch at offset %d: %w", off, err)
		}
		idx.seq = seq
		off += int64(n)
	}
	idx.end = off
	if idx.truncated > 0 {
		idx.end = size - idx.truncated
	}
	return idx, nil
}

// fjBatchReader reads and checks batches from the first size bytes of a
// journal file with salt.
type fjBatchReader struct {
	r    io.ReaderAt
	size int64
	salt uint64
	buf  []byte // the last batch read; records alias it
}

// batchAt reads the batch at off, as fjReadBatch checks it. err is only
// for a failed read; a batch that is short, damaged or not there is !ok.
func (rd *fjBatchReader) batchAt(off int64) (seq uint64, records []byte, n int, ok bool, err error) {
	if rd.size-off < fjBatchHdrLen {
		return 0, nil, 0, false, nil
	}
	var hdr [fjBatchHdrLen]byte
	if _, err := rd.r.ReadAt(hdr[:], off); err != nil {
		return 0, nil, 0, false, err
	}
	size := binary.LittleEndian.Uint32(hdr[4:])
	if binary.LittleEndian.Uint32(hdr[:]) != fjMagic(rd.salt) || size == 0 || size > fjMaxBatch || int64(size) > rd.size-off-fjBatchHdrLen {
		return 0, nil, 0, false, nil
	}
	total := fjBatchHdrLen + int(size)
	if cap(rd.buf) < total {
		rd.buf = make([]byte, total)
	}
	rd.buf = rd.buf[:total]
	if _, err := rd.r.ReadAt(rd.buf, off); err != nil {
		return 0, nil, 0, false, err
	}
	seq, records, n, ok = fjReadBatch(rd.buf, off, rd.salt)
	return seq, records, n, ok, nil
}

// fjFindWindow is how much of the file find scans for the batch magic
// per read.
const fjFindWindow = 1 << 20

// find returns the offset of the first valid batch at or after from whose
// sequence number is above after (any, when after is 0), or -1. It scans
// for the file's batch magic a window at a time and checks each match.
func (rd *fjBatchReader) find(from int64, after uint64) (int64, error) {
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], fjMagic(rd.salt))
	window := make([]byte, fjFindWindow+len(magic)-1)
	for from < rd.size {
		w := window[:min(int64(len(window)), rd.size-from)]
		if _, err := rd.r.ReadAt(w, from); err != nil {
			return 0, err
		}
		for i := 0; ; {
			k := bytes.Index(w[i:], magic[:])
			if k < 0 {
				break
			}
			p := from + int64(i+k)
			seq, _, _, ok, err := rd.batchAt(p)
			if err != nil {
				return 0, err
			}
			if ok && (after == 0 || seq > after) {
				return p, nil
			}
			i += k + 1
		}
		// Windows overlap by len(magic)-1 bytes, so a magic across the
		// edge is found in the next one.
		from += int64(max(len(w)-len(magic)+1, 1))
	}
	return -1, nil
}

// applyBatch applies a batch's records, which start at file offset base.
// A batch that passed its CRC but holds a bad record was written that way:
// that is corruption, not a torn write.
func (idx *fjIndex) applyBatch(records []byte, base int64, salvage bool) error {
	for p := 0; p < len(records); {
		payload, n, ok := fjReadRecord(records[p:])
		if !ok {
			if salvage {
				return nil
			}
			return fmt.Errorf("%w: bad record at offset %d", ErrJournalCorrupt, base+int64(p))
		}
		rec, err := fjDecodeRecord(payload)
		if err == nil {
			err = idx.apply(rec, base+int64(p), n)
		}
		if err != nil && !salvage {
			return fmt.Errorf("record at offset %d: %w", base+int64(p), err)
		}
		p += n
	}
	return nil
}

// apply applies one record, stored at off with length n, to the index.
func (idx *fjIndex) apply(rec *fjRecord, off int64, n int) error {
	le, exists := idx.byKey[rec.key]
	switch rec.kind {
	case fjKindBegin:
		if exists {
			return fmt.Errorf("%w: key %q stored twice", ErrJournalCorrupt, rec.key)
		}
		if rec.operation != "" {
			if _, dup := idx.byOp[rec.operation]; dup {
				return fmt.Errorf("%w: operation %q stored twice", ErrJournalCorrupt, rec.operation)
			}
			idx.byOp[rec.operation] = rec.key
		}
		idx.byKey[rec.key] = &fjEntry{
			key: rec.key, operation: rec.operation, created: rec.created, updated: rec.updated,
			attempts: rec.attempts, lastStatus: rec.lastStatus, state: rec.state,
			off: off, size: int32(n),
		}
		idx.live += int64(n) + fjEntryOverhead
	case fjKindFinish:
		if !exists {
			return fmt.Errorf("%w: outcome of unknown key %q", ErrJournalCorrupt, rec.key)
		}
		le.state, le.lastStatus, le.attempts, le.updated = rec.state, rec.lastStatus, rec.attempts, rec.updated
	case fjKindDelete:
		if !exists {
			return fmt.Errorf("%w: deletion of unknown key %q", ErrJournalCorrupt, rec.key)
		}
		delete(idx.byKey, rec.key)
		if le.operation != "" {
			delete(idx.byOp, le.operation)
		}
		idx.live -= int64(le.size) + fjEntryOverhead
	}
	return nil
}

// verify replays the durable part of the file and compares it with the
// index.
func (j *FileJournal) verify(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := j.lockToRead(); err != nil {
		return err
	}
	defer j.fileMu.RUnlock()
	// Durable entries, as of this instant: commits wait for mu to publish,
	// and compaction for fileMu.
	size := j.size.Load()
	skipped := j.skipped
	type place struct {
		off  int64
		size int32
	}
	want := make(map[string]place, len(j.byKey))
	for k, le := range j.byKey {
		if le.batch == nil {
			want[k] = place{le.off, le.size}
		}
	}
	j.mu.Unlock()

	idx, err := fjReplayFrom(j.f, size, false)
	if err != nil {
		return err
	}
	if idx.truncated > 0 {
		return fmt.Errorf("%w: damaged batch at offset %d, inside data already on disk", ErrJournalCorrupt, idx.end)
	}
	if skipped > 0 {
		return fmt.Errorf("%w: %d damaged bytes were skipped when the journal was opened", ErrJournalCorrupt, skipped)
	}
	for k, le := range idx.byKey {
		p, ok := want[k]
		if !ok {
			return fmt.Errorf("%w: entry %s is in the file but not in the index", ErrJournalCorrupt, k)
		}
		if p.off != le.off || p.size != le.size {
			return fmt.Errorf("%w: entry %s is at offset %d in the file, %d in the index", ErrJournalCorrupt, k, le.off, p.off)
		}
	}
	for k := range want {
		if _, ok := idx.byKey[k]; !ok {
			return fmt.Errorf("%w: entry %s is in the index but not in the file", ErrJournalCorrupt, k)
		}
	}
	return nil
}

// fjCompactSuffix names the temporary file compaction writes beside the
// journal.
const fjCompactSuffix = ".compact"

// fjCompactBatch is the size of the batches compaction writes.
const fjCompactBatch = 4 << 20

// Compact rewrites the journal file with only its live entries, each as
// one record holding its current state, and replaces the old file with it
// atomically: the new file is written beside the old one, synced, and
// renamed over it, so a crash at any point leaves one or the other whole.
// Prune and OpenFileJournal call it when it would halve the file.
//
// Compact reads and rewrites every live entry. Meanwhile every call that
// waits for the disk (Begin, Delete, Prune, Sync) or reads entries back
// from it (Get, Pending, Entries) waits too; Finish does not. That takes
// about 10 ms per 10 000 entries of 1 KiB on a small VM, plus one
// fdatasync. On
// Windows, which cannot rename over an open file, Compact returns an
// error and the file only grows until its done entries are pruned and a
// new journal is started.
func (j *FileJournal) Compact(ctx context.Context) error {
	if err := j.compact(ctx); err != nil {
		return fmt.Errorf("idemhttp: journal compact: %w", err)
	}
	return nil
}

func (j *FileJournal) compact(ctx context.Context) error {
	if !fjCanCompact {
		return errors.ErrUnsupported
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	j.fileMu.Lock()
	defer j.fileMu.Unlock()
	j.mu.Lock()
	if err := j.writableLocked(); err != nil {
		j.mu.Unlock()
		return err
	}
	// No commit runs while fileMu is held, so every entry outside the
	// batch being filled is on disk, and none is dropped from the index.
	// Appends go on meanwhile, into that batch.
	type live struct {
		le   *fjEntry
		snap fjEntry
	}
	all := make([]live, 0, len(j.byKey))
	for _, le := range j.byKey {
		if le.batch == nil {
			all = append(all, live{le, *le})
		}
	}
	seq := j.seq
	j.mu.Unlock()
	slices.SortFunc(all, func(a, b live) int {
		return cmp.Or(a.snap.created.Compare(b.snap.created), strings.Compare(a.snap.key, b.snap.key))
	})

	tmp := j.path + fjCompactSuffix
	// The new file becomes the journal: it needs the same flags.
	nf, err := fjOpenLocked(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|fjSyncFlag)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		_ = nf.Close()
		_ = os.Remove(tmp)
		return err
	}
	type place struct {
		off  int64
		size int32
	}
	places := make([]place, len(all))
	salt, err := fjNewSalt()
	if err != nil {
		return fail(err)
	}
	buf := append(make([]byte, 0, fjCompactBatch+64<<10), fjFileHeader(salt)...)
	var off int64 // of buf[0] in the new file
	batchStart := -1
	flushBatch := func() error {
		if batchStart >= 0 {
			seq++
			fjSealBatch(buf[batchStart:], seq, off+int64(batchStart), salt)
			batchStart = -1
		}
		if _, err := nf.WriteAt(buf, off); err != nil {
			return err
		}
		off += int64(len(buf))
		buf = buf[:0]
		return nil
	}
	var rbuf []byte
	for i := range all {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return fail(err)
			}
		}
		e, err := j.readEntry(&all[i].snap, rbuf)
		if err != nil {
			return fail(err)
		}
		if batchStart < 0 {
			batchStart = len(buf)
			buf = append(buf, make([]byte, fjBatchHdrLen)...)
		}
		start := len(buf)
		if buf, err = fjAppendBegin(buf, e); err != nil {
			return fail(err)
		}
		places[i] = place{off + int64(start), int32(len(buf) - start)}
		if len(buf)-batchStart >= fjCompactBatch {
			if err := flushBatch(); err != nil {
				return fail(err)
			}
		}
	}
	if err := flushBatch(); err != nil {
		return fail(err)
	}
	end := off
	if err := fjDatasync(nf); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, j.path); err != nil {
		return fail(err)
	}
	// From here the new file is the journal: switch to it even if the
	// directory sync fails, and report that.
	dirErr := fjSyncDir(j.path)

	j.mu.Lock()
	old := j.f
	j.f = nf
	var liveBytes int64
	for i := range all {
		all[i].le.off, all[i].le.size = places[i].off, places[i].size
		liveBytes += int64(places[i].size) + fjEntryOverhead
	}
	// The batch being filled goes after the new file's end: move it, and
	// the entries it stores.
	delta := end - j.cur.off
	j.cur.off = end
	for _, le := range j.cur.begins {
		le.off += delta
		liveBytes += int64(le.size) + fjEntryOverhead
	}
	j.live = liveBytes
	j.seq, j.salt = seq, salt
	j.size.Store(end)
	j.skipped = 0 // the damage SkipVerify skipped is not in the new file
	j.compactions.Add(1)
	j.mu.Unlock()
	_ = old.Close() // releases the old inode's lock; nf holds the new one's
	return dirErr
}
