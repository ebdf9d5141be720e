package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
)

// ApplyFunc receives one record during replay: its offset in the file,
// its total length (header included) and its payload, which is only
// valid during the call. An error stops the replay, unless it salvages.
type ApplyFunc func(off int64, n int, payload []byte) error

// Replayed describes what a replay found.
type Replayed struct {
	Salt    uint64 // the file's, from its header
	Version uint32 // the file's format version, from its header
	Seq     uint64 // the last valid batch's sequence number, 0 if none
	End     int64  // where the valid batches end

	// Truncated is the size of the incomplete or damaged tail after End,
	// with nothing valid after it: a group commit that a crash cut short,
	// or damage to the last batches that nothing after them can expose.
	// Zeros after it, to the end of the file, are not counted: see Free.
	Truncated int64

	// Free is the size of the zeros that end the file, after End and
	// any torn tail: space the log preallocated for its next batches
	// (see docs/journal-format.md), not damage.
	Free int64

	// Skipped is the size of the damaged batches skipped (salvage only).
	Skipped int64

	// Clean is true when the last valid batch is the marker a clean close
	// writes, with nothing after it.
	Clean bool

	// Last names the last valid batch (zero if none).
	Last Checkpoint

	// Resumed is true when the replay started after a checkpoint's batch
	// (see [Options.Resume]): the records up to its end were not applied.
	Resumed bool
}

// Replay reads the first size bytes of r, a journal file, a batch at a
// time, and passes every record to apply in order, so that replay takes
// memory for the caller's state and the largest batch, not for the whole
// file. A damaged batch followed by a valid one is damage to data that
// was acknowledged: an error wrapping [ErrCorrupt], unless salvage, which
// skips it (and any batch out of sequence), and ignores apply's errors
// and a batch's records after one that does not parse.
func Replay(r io.ReaderAt, size int64, salvage bool, apply ApplyFunc) (*Replayed, error) {
	return replay(r, size, salvage, apply, nil, nil)
}

// ReplayDigest is Replay passing apply what digest makes of each payload
// (see [Options.Digest]), as [Open] does.
func ReplayDigest(r io.ReaderAt, size int64, salvage bool, apply ApplyFunc, digest DigestFunc) (*Replayed, error) {
	return replay(r, size, salvage, apply, digest, nil)
}

// SetReadAheadWindow sets how much of a file the read-ahead reads at
// once, n bytes, and returns what restores it: for tests, which need the
// read-ahead on files of a few KiB (it runs for files of two windows or
// more). It must not be called while a replay runs.
func SetReadAheadWindow(n int) (restore func()) {
	saved := readAheadWindow
	readAheadWindow = max(n, BatchHeaderLen)
	return func() { readAheadWindow = saved }
}

// DigestFunc makes what apply needs of a record's payload (see
// [Options.Digest]): it appends it to dst and returns it, or returns the
// error apply would have returned for the record.
type DigestFunc func(dst, payload []byte) ([]byte, error)

// replay is Replay passing apply, if digest is set, what digest makes of
// each payload instead of the payload, and starting after the batch of
// resume's checkpoint if it is in the file (see [Options.Resume]). For a
// file read ahead, digest runs on the read-ahead's goroutine.
func replay(r io.ReaderAt, size int64, salvage bool, apply ApplyFunc, digest DigestFunc, resume func(uint64) (Checkpoint, func() error, bool)) (*Replayed, error) {
	// applyDigest takes what the read-ahead digested; apply, the records
	// replay reads itself, digested here.
	applyDigest := apply
	if digest != nil {
		var scratch []byte
		apply = func(off int64, n int, payload []byte) error {
			d, err := digest(scratch[:0], payload)
			scratch = d
			if err != nil {
				return err
			}
			return applyDigest(off, n, d)
		}
	}
	hdr := make([]byte, min(size, FileHeaderLen))
	if size > 0 {
		if _, err := r.ReadAt(hdr, 0); err != nil {
			return nil, err
		}
	}
	if tornHeader(hdr) {
		// A new file, its header not (or not all) written yet, as a
		// writer would create it: an empty log. (A writer's Open writes
		// the header first; a read-only open, or Verify, sees it so.)
		return &Replayed{End: size, Version: Version}, nil
	}
	salt, version, err := ReadFileHeader(hdr)
	if err != nil {
		return nil, err
	}
	res := &Replayed{Salt: salt, Version: version}
	rd := &batchReader{r: r, size: size, salt: salt}
	off := int64(FileHeaderLen)
	marker := false
	if resume != nil {
		if cp, load, ok := resume(salt); ok && cp.Salt == salt && cp.Off >= off && cp.Off < size {
			seq, records, n, ok, err := rd.batchAt(cp.Off)
			if err != nil {
				return nil, err
			}
			nonce, isMarker := markerNonce(records)
			if ok && seq == cp.Seq && n == cp.Len && binary.LittleEndian.Uint32(rd.buf[16:]) == cp.CRC && nonce == cp.Nonce && load() == nil {
				off, res.Seq, res.Last, res.Resumed = cp.End(), seq, cp, true
				marker = isMarker
			}
		}
	}
	var ra *readAhead
	if size-off >= 2*int64(readAheadWindow) {
		ra = startReadAhead(r, size, salt, off, digest)
		defer ra.stop()
	}
	for off < size {
		if ra != nil {
			// The usual case, a file with no damage: runs of whole,
			// checked batches in sequence, read and checked by the
			// read-ahead while the records before them are applied.
			run, more := <-ra.runs
			if more && run.off == off && (res.Seq == 0 || run.batches[0].seq == res.Seq+1) {
				rec := 0
				for _, bt := range run.batches {
					records := run.buf[bt.start+BatchHeaderLen : bt.start+bt.n]
					var nonce uint64
					nonce, marker = markerNonce(records)
					var err error
					switch {
					case marker:
					case digest == nil:
						err = applyChecked(records, off+BatchHeaderLen, salvage, apply)
					default:
						err = run.applyDigests(rec, bt.recs, off+BatchHeaderLen, salvage, applyDigest)
					}
					if err != nil {
						return nil, fmt.Errorf("batch at offset %d: %w", off, err)
					}
					rec = bt.recs
					res.Seq = bt.seq
					res.Last = Checkpoint{Salt: salt, Off: off, Len: bt.n, Seq: bt.seq, CRC: binary.LittleEndian.Uint32(run.buf[bt.start+16:]), Nonce: nonce}
					off += int64(bt.n)
				}
				ra.recycle(run)
				continue
			}
			// Past the last run the read-ahead could check: whatever
			// comes next (damage, a torn tail, a batch out of
			// sequence, the end) is judged below, one batch at a time.
			ra.stop()
			ra = nil
			continue
		}
		seq, records, n, ok, err := rd.batchAt(off)
		if err != nil {
			return nil, err
		}
		if ok && res.Seq != 0 && seq != res.Seq+1 {
			if !salvage {
				return nil, fmt.Errorf("%w: batch at offset %d has sequence number %d, want %d", ErrCorrupt, off, seq, res.Seq+1)
			}
			// Intact but out of place (a gap, or an old number): its
			// records may refer to batches that are gone. Skip it, and
			// take the next batch's number as it comes.
			res.Skipped += int64(n)
			res.Seq = 0
			off += int64(n)
			marker = false // a marker before it is not the file's end
			continue
		}
		if !ok {
			next, err := rd.find(off+1, res.Seq)
			if err != nil {
				return nil, err
			}
			if next < 0 {
				// Nothing valid follows: a group commit the crash cut
				// short, or damage nothing after it can expose, and
				// the zeros of the preallocated tail after it (only
				// zeros: free space, not a torn write).
				used, err := lastNonZero(r, off, size)
				if err != nil {
					return nil, err
				}
				res.Truncated, res.Free = used-off, size-used
				break
			}
			if !salvage {
				return nil, fmt.Errorf("%w: damaged batch at offset %d, followed by a valid one at offset %d", ErrCorrupt, off, next)
			}
			res.Skipped += next - off
			res.Seq = 0 // accept the next batch's number, whatever it is
			off = next
			marker = false
			continue
		}
		var nonce uint64
		nonce, marker = markerNonce(records)
		if !marker {
			if err := applyBatch(records, off+BatchHeaderLen, salvage, apply); err != nil {
				return nil, fmt.Errorf("batch at offset %d: %w", off, err)
			}
		}
		res.Seq = seq
		res.Last = Checkpoint{Salt: salt, Off: off, Len: n, Seq: seq, CRC: binary.LittleEndian.Uint32(rd.buf[16:]), Nonce: nonce}
		off += int64(n)
	}
	res.End = off
	if res.Truncated > 0 || res.Free > 0 {
		res.End = size - res.Truncated - res.Free
	}
	res.Clean = marker && res.Truncated == 0
	return res, nil
}

// applyBatch passes a batch's records, which start at file offset base,
// to apply. A batch that passed its CRC but holds a bad record was
// written that way: that is corruption, not a torn write.
func applyBatch(records []byte, base int64, salvage bool, apply ApplyFunc) error {
	for p := 0; p < len(records); {
		payload, n, ok := ReadRecord(records[p:])
		if !ok {
			if salvage {
				return nil
			}
			return fmt.Errorf("%w: bad record at offset %d", ErrCorrupt, base+int64(p))
		}
		if err := apply(base+int64(p), n, payload); err != nil && !salvage {
			return fmt.Errorf("record at offset %d: %w", base+int64(p), err)
		}
		p += n
	}
	return nil
}

// applyChecked is applyBatch for a batch whose records were all checked
// already (by the read-ahead).
func applyChecked(records []byte, base int64, salvage bool, apply ApplyFunc) error {
	for p := 0; p < len(records); {
		n := RecordHeaderLen + int(binary.LittleEndian.Uint32(records[p:]))
		if err := apply(base+int64(p), n, records[p+RecordHeaderLen:p+n]); err != nil && !salvage {
			return fmt.Errorf("record at offset %d: %w", base+int64(p), err)
		}
		p += n
	}
	return nil
}

// applyDigests passes apply the digests of the run's records from to
// end, the records of one batch whose records start at file offset base.
func (run *aheadRun) applyDigests(from, end int, base int64, salvage bool, apply ApplyFunc) error {
	off, d := base, 0
	if from > 0 {
		d = int(run.recs[from-1].dend)
	}
	for _, rec := range run.recs[from:end] {
		if err := apply(off, int(rec.n), run.digests[d:rec.dend]); err != nil && !salvage {
			return fmt.Errorf("record at offset %d: %w", off, err)
		}
		off += int64(rec.n)
		d = int(rec.dend)
	}
	return nil
}

// readAheadWindow is how much of the file the read-ahead reads at once;
// a batch larger than that is read whole.
var readAheadWindow = 4 << 20 // a variable for the tests

// readAhead reads a file's batches ahead of replay, on a goroutine of its
// own, and checks them (the batch's CRC, every record's framing and CRC,
// the sequence numbers), so that replaying a large journal takes the
// time of the slower of reading and applying, not of both: on a small
// VM, opening a million entries of 1 KiB spent about 40% of its time in
// reads and CRCs. It hands over runs of batches that replay would accept
// as they are, and stops at the first batch it would not: replay judges
// that one, and everything after it, itself.
type readAhead struct {
	runs   chan *aheadRun // closed when the read-ahead stops
	free   chan *aheadRun // runs back from replay, for their buffers
	done   chan struct{}  // closed by stop
	digest DigestFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// aheadRun is a run of consecutive checked batches, read from off into
// buf, and with a DigestFunc the digests of their records.
type aheadRun struct {
	off     int64
	buf     []byte
	batches []aheadBatch
	digests []byte
	recs    []aheadRec
}

type aheadBatch struct {
	seq      uint64
	start, n int // in the run's buf
	recs     int // the index in recs past the batch's last record
}

// aheadRec is a record's length and where its digest ends in digests.
type aheadRec struct{ n, dend int32 }

func startReadAhead(r io.ReaderAt, size int64, salt uint64, off int64, digest DigestFunc) *readAhead {
	ra := &readAhead{runs: make(chan *aheadRun, 1), free: make(chan *aheadRun, 3), done: make(chan struct{}), digest: digest}
	for range 3 {
		ra.free <- &aheadRun{buf: make([]byte, readAheadWindow)}
	}
	ra.wg.Add(1)
	go func() {
		defer ra.wg.Done()
		defer close(ra.runs)
		ra.loop(r, size, salt, off)
	}()
	return ra
}

// stop ends the read-ahead and waits for it. Idempotent.
func (ra *readAhead) stop() {
	ra.once.Do(func() {
		close(ra.done)
		for range ra.runs { // unblock a pending send
		}
		ra.wg.Wait()
	})
}

// recycle gives a run back, for its buffers.
func (ra *readAhead) recycle(run *aheadRun) {
	select {
	case ra.free <- run:
	default:
	}
}

// takeBatch reports whether the read-ahead may hand over a batch with
// these records: every record whole and passing its checks and, with a
// DigestFunc, digested into run (on false, run is as before). A close
// marker is not digested: replay does not apply it. One pass over the
// records does both.
func (ra *readAhead) takeBatch(run *aheadRun, records []byte) bool {
	if isCloseMarker(records) {
		return true
	}
	d, r := len(run.digests), len(run.recs)
	for p := 0; p < len(records); {
		payload, n, ok := ReadRecord(records[p:])
		if ok && ra.digest != nil {
			var err error
			run.digests, err = ra.digest(run.digests, payload)
			ok = err == nil // on an error, replay digests the batch again and takes it
			run.recs = append(run.recs, aheadRec{n: int32(n), dend: int32(len(run.digests))})
		}
		if !ok {
			run.digests, run.recs = run.digests[:d], run.recs[:r]
			return false
		}
		p += n
	}
	return true
}

func (ra *readAhead) loop(r io.ReaderAt, size int64, salt uint64, off int64) {
	var seq uint64
	for off < size {
		var run *aheadRun
		select {
		case run = <-ra.free:
		case <-ra.done:
			return
		}
		buf := run.buf[:cap(run.buf)]
		run.off, run.buf, run.batches, run.digests, run.recs = off, buf, run.batches[:0], run.digests[:0], run.recs[:0]
		n := int(min(int64(len(buf)), size-off))
		if _, err := r.ReadAt(buf[:n], off); err != nil {
			return // replay reads it again, and reports the error
		}
		p, final := 0, false
		for p+BatchHeaderLen <= n {
			bsize := binary.LittleEndian.Uint32(buf[p+4:])
			if binary.LittleEndian.Uint32(buf[p:]) != Magic(salt) || bsize == 0 || bsize > MaxBatch ||
				int64(bsize) > size-off-int64(p)-BatchHeaderLen {
				final = true
				break
			}
			total := BatchHeaderLen + int(bsize)
			if p+total > n {
				if p > 0 {
					break // the next window starts with it
				}
				// Larger than the window: read it whole.
				big := make([]byte, total)
				if _, err := r.ReadAt(big, off); err != nil {
					return
				}
				run.buf, buf, n = big, big, total
			}
			bseq, records, bn, ok := ReadBatch(buf[p:p+total], off+int64(p), salt)
			if !ok || (seq != 0 && bseq != seq+1) || !ra.takeBatch(run, records) {
				final = true
				break
			}
			run.batches = append(run.batches, aheadBatch{seq: bseq, start: p, n: bn, recs: len(run.recs)})
			seq = bseq
			p += bn
		}
		// A header cut by the window's end continues in the next one;
		// at the end of the file, the next finds no batch and stops.
		if len(run.batches) == 0 {
			return
		}
		select {
		case ra.runs <- run:
		case <-ra.done:
			return
		}
		if final {
			return
		}
		off += int64(p)
	}
}

// batchReader reads and checks batches from the first size bytes of a
// journal file with salt.
type batchReader struct {
	r      io.ReaderAt
	size   int64
	salt   uint64
	buf    []byte // the last batch read; records alias it
	window []byte // find's, kept for the next damaged region
}

// batchAt reads the batch at off, as ReadBatch checks it. err is only
// for a failed read; a batch that is short, damaged or not there is !ok.
func (rd *batchReader) batchAt(off int64) (seq uint64, records []byte, n int, ok bool, err error) {
	if rd.size-off < BatchHeaderLen {
		return 0, nil, 0, false, nil
	}
	var hdr [BatchHeaderLen]byte
	if _, err := rd.r.ReadAt(hdr[:], off); err != nil {
		return 0, nil, 0, false, err
	}
	size := binary.LittleEndian.Uint32(hdr[4:])
	if binary.LittleEndian.Uint32(hdr[:]) != Magic(rd.salt) || size == 0 || size > MaxBatch || int64(size) > rd.size-off-BatchHeaderLen {
		return 0, nil, 0, false, nil
	}
	total := BatchHeaderLen + int(size)
	if cap(rd.buf) < total {
		rd.buf = make([]byte, total)
	}
	rd.buf = rd.buf[:total]
	if _, err := rd.r.ReadAt(rd.buf, off); err != nil {
		return 0, nil, 0, false, err
	}
	seq, records, n, ok = ReadBatch(rd.buf, off, rd.salt)
	return seq, records, n, ok, nil
}

// FindWindow is how much of the file replay scans for the batch magic per
// read when it searches past damage.
const FindWindow = 1 << 20

// find returns the offset of the first valid batch at or after from whose
// sequence number is above after (any, when after is 0), or -1. It scans
// for the file's batch magic a window at a time and checks each match:
// the magic is salted, so it finds almost only real batch starts.
func (rd *batchReader) find(from int64, after uint64) (int64, error) {
	var magic [4]byte
	binary.LittleEndian.PutUint32(magic[:], Magic(rd.salt))
	// One window for every damaged region a salvage crosses: a MiB each
	// time added up to gigabytes over a badly damaged file. No more than
	// what is left of the file, which later calls, further on, need less
	// of: a torn tail of a small file is common after a crash, and a MiB
	// cleared for each cost a simulated crash test most of its time.
	if need := min(int64(FindWindow+len(magic)-1), rd.size-from); int64(len(rd.window)) < need {
		rd.window = make([]byte, need)
	}
	window := rd.window
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

// lastNonZero returns the end of the last byte of r from off to size
// that is not zero: off if there is none. It reads the file backwards a
// window at a time, so that a preallocated tail of zeros costs one read
// of its size, and a torn write at its start is found by the first
// window that holds it.
func lastNonZero(r io.ReaderAt, off, size int64) (int64, error) {
	buf := make([]byte, 2*min(size-off, FindWindow))
	buf, zeros := buf[:len(buf)/2], buf[len(buf)/2:]
	for end := size; end > off; {
		start := max(off, end-int64(len(buf)))
		w := buf[:end-start]
		if _, err := r.ReadAt(w, start); err != nil {
			return 0, err
		}
		if !bytes.Equal(w, zeros[:len(w)]) { // memcmp's speed, not a byte loop's
			return start + int64(len(bytes.TrimRight(w, "\x00"))), nil
		}
		end = start
	}
	return off, nil
}
