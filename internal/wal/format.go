package wal

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Format constants. The layout they describe is in the package
// documentation.
const (
	// Version is the format version this package writes. Versions 1
	// and 2 were bbolt files; 3 was this log without close markers; 4
	// (the previous release), with close markers that carried no nonce;
	// 5, before a file's tail was preallocated with zeros. It reads
	// every version from MinVersion on, and an Open for writing moves an
	// older file's header to Version before it appends anything (see
	// docs/journal-format.md).
	Version = 6

	// MinVersion is the oldest format version this package reads.
	MinVersion = 4

	FileHeaderLen   = 24 // "IDEMJRNL", version, salt, CRC
	BatchHeaderLen  = 20 // magic, length, sequence number, CRC
	RecordHeaderLen = 8  // length, CRC

	// MaxRecord bounds a record's payload and MaxBatch a batch's records,
	// so that a damaged length cannot make replay allocate or skip
	// gigabytes.
	MaxRecord = 64 << 20
	MaxBatch  = 1 << 30

	batchMagic = 0x314a4449 // "IDJ1" read as little endian
)

// Errors. Callers wrap them or export them under their own names.
var (
	// ErrCorrupt: the file or one of its records is damaged.
	ErrCorrupt = errors.New("journal file is corrupt")

	// ErrNotJournal: the file is not a journal at all. Nothing in it was
	// changed.
	ErrNotJournal = errors.New("not an idemhttp journal file")

	// ErrVersion: the file was written in a format version this build
	// does not read (a newer one, or one from before the log).
	ErrVersion = errors.New("journal format version not supported by this build")

	// ErrLocked: another writer has the file open.
	ErrLocked = errors.New("journal file is locked: another journal has it open")

	// ErrClosed: the log was closed.
	ErrClosed = errors.New("journal is closed")

	// ErrReadOnly: the log was opened read-only.
	ErrReadOnly = errors.New("journal is open read-only")

	// ErrReplaced: the file the log writes is no longer the one its path
	// names (deleted, or replaced by another file).
	ErrReplaced = errors.New("journal file was deleted or replaced while open")

	// ErrBatchFull: the batch being filled cannot take the records; wait
	// for it ([Batch.Done]) and try again.
	ErrBatchFull = errors.New("batch full")
)

// fileMagic opens every journal file.
var fileMagic = [8]byte{'I', 'D', 'E', 'M', 'J', 'R', 'N', 'L'}

// crcTable is the Castagnoli table: hardware-accelerated on amd64 and
// arm64, and the polynomial storage systems use to catch torn or flipped
// bytes.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C of b, as the format uses it.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, crcTable) }

// FileHeader returns the header of a new journal file with salt.
func FileHeader(salt uint64) []byte { return fileHeaderWith(Version, salt) }

// NewSalt returns a random salt for a new file, from crypto/rand.
func NewSalt() (uint64, error) { return random64(nil) }

// random64 reads a random uint64 from r, crypto/rand if r is nil.
func random64(r io.Reader) (uint64, error) {
	if r == nil {
		r = rand.Reader
	}
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, fmt.Errorf("random source: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// fileHeaderWith returns the header of a journal file of version v
// with salt.
func fileHeaderWith(v uint32, salt uint64) []byte {
	h := make([]byte, FileHeaderLen)
	copy(h, fileMagic[:])
	binary.LittleEndian.PutUint32(h[8:], v)
	binary.LittleEndian.PutUint64(h[12:], salt)
	binary.LittleEndian.PutUint32(h[20:], Checksum(h[:20]))
	return h
}

// CheckFileHeader reports whether b starts with a journal file header
// this build can read, and returns the file's salt. The errors wrap
// [ErrNotJournal], [ErrCorrupt] or [ErrVersion].
func CheckFileHeader(b []byte) (salt uint64, err error) {
	salt, _, err = ReadFileHeader(b)
	return salt, err
}

// ReadFileHeader is [CheckFileHeader], returning the file's format
// version too: one from [MinVersion] to [Version].
func ReadFileHeader(b []byte) (salt uint64, version uint32, err error) {
	if len(b) < FileHeaderLen || [8]byte(b[:8]) != fileMagic {
		return 0, 0, fmt.Errorf("%w (journals written before format 3, by the bbolt engine, cannot be read: finish or delete them with the build that wrote them)", ErrNotJournal)
	}
	if Checksum(b[:20]) != binary.LittleEndian.Uint32(b[20:24]) {
		return 0, 0, fmt.Errorf("%w: damaged file header", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:12]); v < MinVersion || v > Version {
		return 0, 0, fmt.Errorf("%w: journal format version %d, this build reads versions %d to %d", ErrVersion, v, MinVersion, Version)
	}
	return binary.LittleEndian.Uint64(b[12:20]), binary.LittleEndian.Uint32(b[8:12]), nil
}

// Magic is the batch magic of a file with salt.
func Magic(salt uint64) uint32 { return batchMagic ^ uint32(salt) }

// SealBatch fills in the header that b's first BatchHeaderLen bytes
// reserve, for the records after it, for a batch written at file offset
// off in a file with salt.
func SealBatch(b []byte, seq uint64, off int64, salt uint64) {
	binary.LittleEndian.PutUint32(b[0:], Magic(salt))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(b)-BatchHeaderLen))
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint32(b[16:], batchCRC(b[4:16], b[BatchHeaderLen:], off, salt))
}

// batchCRC is the CRC of a batch at offset off in a file with salt,
// with header fields hdr (length and sequence number) and records.
func batchCRC(hdr, records []byte, off int64, salt uint64) uint32 {
	var pre [16]byte
	binary.LittleEndian.PutUint64(pre[:], salt)
	binary.LittleEndian.PutUint64(pre[8:], uint64(off))
	crc := crc32.Update(Checksum(pre[:]), crcTable, hdr)
	return crc32.Update(crc, crcTable, records)
}

// ReadBatch checks the batch at the start of b, which is at file offset
// off in a file with salt, and returns its sequence number, its records
// and its total length. ok is false for anything but a whole batch with a
// matching magic and CRC. It never panics and never allocates.
func ReadBatch(b []byte, off int64, salt uint64) (seq uint64, records []byte, n int, ok bool) {
	if len(b) < BatchHeaderLen || binary.LittleEndian.Uint32(b) != Magic(salt) {
		return 0, nil, 0, false
	}
	size := binary.LittleEndian.Uint32(b[4:])
	if size == 0 || size > MaxBatch || uint64(size) > uint64(len(b)-BatchHeaderLen) {
		return 0, nil, 0, false
	}
	records = b[BatchHeaderLen : BatchHeaderLen+int(size)]
	if batchCRC(b[4:16], records, off, salt) != binary.LittleEndian.Uint32(b[16:]) {
		return 0, nil, 0, false
	}
	return binary.LittleEndian.Uint64(b[8:]), records, BatchHeaderLen + int(size), true
}

// AppendRecord frames payload as a record at the end of dst.
func AppendRecord(dst, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	crc := crc32.Update(Checksum(dst[len(dst)-4:]), crcTable, payload)
	dst = binary.LittleEndian.AppendUint32(dst, crc)
	return append(dst, payload...)
}

// FinishRecord fills in the length and CRC of the record that rec holds:
// RecordHeaderLen reserved bytes, then the payload. It lets a caller
// encode a payload in place instead of copying it into AppendRecord.
func FinishRecord(rec []byte) {
	binary.LittleEndian.PutUint32(rec, uint32(len(rec)-RecordHeaderLen))
	binary.LittleEndian.PutUint32(rec[4:], crc32.Update(Checksum(rec[:4]), crcTable, rec[RecordHeaderLen:]))
}

// ReadRecord checks the record at the start of b and returns its
// payload and total length; ok is false for a short, oversized or
// mismatched record. It never panics and never allocates.
func ReadRecord(b []byte) (payload []byte, n int, ok bool) {
	if len(b) < RecordHeaderLen {
		return nil, 0, false
	}
	size := binary.LittleEndian.Uint32(b)
	if size == 0 || size > MaxRecord || uint64(size) > uint64(len(b)-RecordHeaderLen) {
		return nil, 0, false
	}
	payload = b[RecordHeaderLen : RecordHeaderLen+int(size)]
	if crc32.Update(Checksum(b[:4]), crcTable, payload) != binary.LittleEndian.Uint32(b[4:]) {
		return nil, 0, false
	}
	return payload, RecordHeaderLen + int(size), true
}

// closeMarkerLen is the length of a close marker's payload; a close
// marker of format 4 is only its first byte.
const closeMarkerLen = 9

// closeMarker returns the payload of the record a clean close appends,
// alone in its batch: a zero byte (callers' payloads never start with
// one), then the close's nonce, random, so that two copies of one file
// that diverged (the same salt, writes of the same sizes) never end in
// byte-identical markers, whose checkpoints an index file beside the
// one could then pass off as the other's (see [Checkpoint]).
func closeMarker(nonce uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{0}, nonce)
}

// markerNonce reports whether a batch's records are a close marker, and
// returns its nonce: 0 for a marker of format 4, which had none (a file
// of that version upgraded in place keeps them; no payload of the layer
// above is a lone zero byte, or starts with one).
func markerNonce(records []byte) (nonce uint64, ok bool) {
	p, n, ok := ReadRecord(records)
	if !ok || n != len(records) || len(p) == 0 || p[0] != 0 {
		return 0, false
	}
	switch len(p) {
	case 1:
		return 0, true
	case closeMarkerLen:
		return binary.LittleEndian.Uint64(p[1:]), true
	}
	return 0, false
}

// isCloseMarker reports whether a batch's records are a close marker.
func isCloseMarker(records []byte) bool {
	_, ok := markerNonce(records)
	return ok
}
