package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
)

// ApplyFunc receives one record during replay: its offset in the file,
// its total length (header included) and its payload, which is only
// valid during the call. An error stops the replay, unless it salvages.
type ApplyFunc func(off int64, n int, payload []byte) error

// Replayed describes what a replay found.
type Replayed struct {
	Salt uint64 // the file's, from its header
	Seq  uint64 // the last valid batch's sequence number, 0 if none
	End  int64  // where the valid batches end

	// Truncated is the size of the incomplete or damaged tail after End,
	// with nothing valid after it: a group commit that a crash cut short,
	// or damage to the last batches that nothing after them can expose.
	Truncated int64

	// Skipped is the size of the damaged batches skipped (salvage only).
	Skipped int64

	// Clean is true when the last valid batch is the marker a clean close
	// writes, with nothing after it.
	Clean bool
}

// Replay reads the first size bytes of r, a journal file, a batch at a
// time, and passes every record to apply in order, so that replay takes
// memory for the caller's state and the largest batch, not for the whole
// file. A damaged batch followed by a valid one is damage to data that
// was acknowledged: an error wrapping [ErrCorrupt], unless salvage, which
// skips it (and any batch out of sequence), and ignores apply's errors
// and a batch's records after one that does not parse.
func Replay(r io.ReaderAt, size int64, salvage bool, apply ApplyFunc) (*Replayed, error) {
	hdr := make([]byte, min(size, FileHeaderLen))
	if _, err := r.ReadAt(hdr, 0); err != nil {
		return nil, err
	}
	salt, err := CheckFileHeader(hdr)
	if err != nil {
		return nil, err
	}
	res := &Replayed{Salt: salt}
	rd := &batchReader{r: r, size: size, salt: salt}
	off := int64(FileHeaderLen)
	marker := false
	for off < size {
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
			continue
		}
		if !ok {
			next, err := rd.find(off+1, res.Seq)
			if err != nil {
				return nil, err
			}
			if next < 0 {
				// Nothing valid follows: a group commit the crash cut
				// short, or damage nothing after it can expose.
				res.Truncated = size - off
				break
			}
			if !salvage {
				return nil, fmt.Errorf("%w: damaged batch at offset %d, followed by a valid one at offset %d", ErrCorrupt, off, next)
			}
			res.Skipped += next - off
			res.Seq = 0 // accept the next batch's number, whatever it is
			off = next
			continue
		}
		marker = isCloseMarker(records)
		if !marker {
			if err := applyBatch(records, off+BatchHeaderLen, salvage, apply); err != nil {
				return nil, fmt.Errorf("batch at offset %d: %w", off, err)
			}
		}
		res.Seq = seq
		off += int64(n)
	}
	res.End = off
	if res.Truncated > 0 {
		res.End = size - res.Truncated
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

// batchReader reads and checks batches from the first size bytes of a
// journal file with salt.
type batchReader struct {
	r    io.ReaderAt
	size int64
	salt uint64
	buf  []byte // the last batch read; records alias it
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
	window := make([]byte, FindWindow+len(magic)-1)
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
