package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testSalt is the salt of the files the tests build by hand, and of
// FuzzReplay's corpus (testdata/fuzz/FuzzReplay), whose batch magics are
// sealed with it.
const testSalt = 0x5eed5a17c0ffee42

// rec frames payload as a record.
func rec(payload string) []byte { return AppendRecord(nil, []byte(payload)) }

func cat(p ...[]byte) []byte { return slices.Concat(p...) }

// flip returns a copy of b with byte i inverted.
func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0xff
	return c
}

// batch seals records as one batch numbered seq, as if written at offset
// 0 of a file salted with testSalt: file seals it again where it lands.
func batch(seq uint64, records ...[]byte) []byte {
	b := cat(append([][]byte{make([]byte, BatchHeaderLen)}, records...)...)
	SealBatch(b, seq, 0, testSalt)
	return b
}

// file is a journal file salted with testSalt: the file header, then the
// pieces given. A piece that is a valid batch (for offset 0, as batch
// makes them) is sealed again for its offset in the file; anything else
// (a damaged or torn batch, garbage) is copied as it is.
func file(pieces ...[]byte) []byte {
	out := FileHeader(testSalt)
	for _, p := range pieces {
		off := len(out)
		out = append(out, p...)
		if seq, _, n, ok := ReadBatch(p, 0, testSalt); ok && n == len(p) {
			SealBatch(out[off:], seq, int64(off), testSalt)
		}
	}
	return out
}

func TestReadRecord(t *testing.T) {
	payload := []byte("Dk")
	r := AppendRecord(nil, payload)
	zeroLen := AppendRecord(nil, nil) // length 0 with a matching CRC
	// A length past MaxRecord, in a buffer long enough to hold it and with
	// a matching CRC: only the bound refuses it.
	huge := make([]byte, RecordHeaderLen+MaxRecord+1)
	FinishRecord(huge)
	// A flipped length byte, with enough bytes after it that the length
	// fits: only the CRC, which covers the length, refuses it.
	flippedLen := cat(flip(r, 0)[:4], r[4:], make([]byte, 256))
	tests := []struct {
		name        string
		give        []byte
		wantPayload []byte
		wantLen     int
		wantOK      bool
	}{
		{name: "valid", give: r, wantPayload: payload, wantLen: len(r), wantOK: true},
		{name: "valid, more after it", give: cat(r, r), wantPayload: payload, wantLen: len(r), wantOK: true},
		{name: "empty", give: nil},
		{name: "shorter than a header", give: r[:RecordHeaderLen-1]},
		{name: "header only", give: r[:RecordHeaderLen]},
		{name: "zero length", give: zeroLen},
		{name: "length past the buffer", give: r[:len(r)-1]},
		{name: "length past MaxRecord", give: huge},
		{name: "length of 4 GiB", give: cat([]byte{0xff, 0xff, 0xff, 0xff}, r[4:])},
		{name: "flipped length", give: flippedLen},
		{name: "flipped CRC", give: flip(r, 5)},
		{name: "flipped payload", give: flip(r, len(r)-1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n, ok := ReadRecord(tt.give)
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.wantLen, n)
			assert.Equal(t, tt.wantPayload, got)
		})
	}
}

// FinishRecord, which frames a payload encoded in place, gives the bytes
// AppendRecord gives.
func TestFinishRecord(t *testing.T) {
	for _, payload := range []string{"x", "Bsome payload", string(make([]byte, 300))} {
		b := append(make([]byte, RecordHeaderLen), payload...)
		FinishRecord(b)
		assert.Equal(t, rec(payload), b)
	}
}

func TestReadBatch(t *testing.T) {
	records := cat(rec("Da"), rec("Db"))
	b := batch(7, records)
	empty := batch(7) // length 0 with a matching CRC
	wrongMagic := bytes.Clone(b)
	binary.LittleEndian.PutUint32(wrongMagic, Magic(testSalt)+1)
	otherSalt := bytes.Clone(b)
	SealBatch(otherSalt, 7, 0, testSalt^1<<40) // same magic, another salt
	otherOffset := bytes.Clone(b)
	SealBatch(otherOffset, 7, 1, testSalt)
	tests := []struct {
		name        string
		give        []byte
		wantSeq     uint64
		wantRecords []byte
		wantLen     int
		wantOK      bool
	}{
		{name: "valid", give: b, wantSeq: 7, wantRecords: records, wantLen: len(b), wantOK: true},
		{name: "valid, more after it", give: cat(b, b), wantSeq: 7, wantRecords: records, wantLen: len(b), wantOK: true},
		{name: "empty", give: nil},
		{name: "shorter than a header", give: b[:BatchHeaderLen-1]},
		{name: "header only", give: b[:BatchHeaderLen]},
		{name: "zero length", give: empty},
		{name: "wrong magic", give: wrongMagic},
		{name: "sealed with another salt", give: otherSalt},
		{name: "sealed for another offset", give: otherOffset},
		{name: "length past the buffer", give: b[:len(b)-1]},
		{name: "length of 4 GiB", give: cat(b[:4], []byte{0xff, 0xff, 0xff, 0xff}, b[8:])},
		{name: "flipped sequence number", give: flip(b, 9)},
		{name: "flipped CRC", give: flip(b, 17)},
		{name: "flipped record", give: flip(b, len(b)-1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seq, got, n, ok := ReadBatch(tt.give, 0, testSalt)
			assert.Equal(t, tt.wantOK, ok)
			assert.Equal(t, tt.wantSeq, seq)
			assert.Equal(t, tt.wantLen, n)
			assert.Equal(t, tt.wantRecords, got)
		})
	}
}

// withVersion returns a file header salted with testSalt that claims
// format version v, with a matching CRC.
func withVersion(v uint32) []byte {
	h := FileHeader(testSalt)
	binary.LittleEndian.PutUint32(h[8:], v)
	binary.LittleEndian.PutUint32(h[20:], Checksum(h[:20]))
	return h
}

func TestFileHeader(t *testing.T) {
	hdr := FileHeader(testSalt)
	require.Len(t, hdr, FileHeaderLen)
	assert.Equal(t, []byte("IDEMJRNL"), hdr[:8])
	assert.Equal(t, uint32(Version), binary.LittleEndian.Uint32(hdr[8:]))
	for _, give := range [][]byte{hdr, file(batch(1, rec("Dk")))} {
		salt, err := CheckFileHeader(give)
		assert.NoError(t, err)
		assert.Equal(t, uint64(testSalt), salt)
	}

	tests := []struct {
		name    string
		give    []byte
		wantErr error
		want    string
	}{
		{name: "empty", give: nil, wantErr: ErrNotJournal, want: "not an idemhttp journal"},
		{name: "short", give: hdr[:FileHeaderLen-1], wantErr: ErrNotJournal, want: "not an idemhttp journal"},
		{name: "bbolt file", give: cat([]byte{16: 0xed, 17: 0xda, 18: 0x0c, 19: 0xed}, make([]byte, 4096)), wantErr: ErrNotJournal, want: "not an idemhttp journal"},
		{name: "lowercase magic", give: cat([]byte("idemjrnl"), hdr[8:]), wantErr: ErrNotJournal, want: "not an idemhttp journal"},
		{name: "flipped CRC", give: flip(hdr, 21), wantErr: ErrCorrupt, want: "damaged file header"},
		{name: "flipped version", give: flip(hdr, 8), wantErr: ErrCorrupt, want: "damaged file header"},
		{name: "flipped salt", give: flip(hdr, 13), wantErr: ErrCorrupt, want: "damaged file header"},
		{name: "bbolt-era version", give: withVersion(2), wantErr: ErrVersion, want: "journal format version 2,"},
		{name: "version without close markers", give: withVersion(3), wantErr: ErrVersion, want: "journal format version 3,"},
		{name: "future version", give: withVersion(Version + 1), wantErr: ErrVersion, want: fmt.Sprintf("journal format version %d,", Version+1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CheckFileHeader(tt.give)
			assert.ErrorIs(t, err, tt.wantErr)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	// The versions this build reads: the previous release's (4, close
	// markers without a nonce), 5 (before preallocated tails) and its own.
	for v := uint32(MinVersion); v <= Version; v++ {
		salt, version, err := ReadFileHeader(withVersion(v))
		assert.NoError(t, err, v)
		assert.Equal(t, uint64(testSalt), salt, v)
		assert.Equal(t, v, version)
	}
}

// Every file gets its own salt, and so its own batch magic: a batch
// copied from one file (or a request body holding one) is not a batch of
// another.
func TestNewSalt(t *testing.T) {
	seen := make(map[uint64]bool)
	for range 64 {
		s, err := NewSalt()
		require.NoError(t, err)
		assert.False(t, seen[s], "salt %#x repeated", s)
		seen[s] = true
	}
	assert.NotEqual(t, Magic(testSalt), Magic(testSalt+1))
	assert.Equal(t, Magic(testSalt), Magic(testSalt^1<<40), "the magic holds the salt's low 32 bits only")
}
