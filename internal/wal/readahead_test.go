package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// raFile builds a log file of batches batches with random records (some
// batches larger than the read-ahead windows the tests use), ending in a
// close marker if marked, and returns it with the offset of every batch.
func raFile(rng *rand.Rand, batches int, marked bool) ([]byte, []int64) {
	salt := rng.Uint64()
	file := FileHeader(salt)
	var offs []int64
	for i := range batches {
		off := len(file)
		offs = append(offs, int64(off))
		file = append(file, make([]byte, BatchHeaderLen)...)
		for range 1 + rng.IntN(6) {
			size := 1 + rng.IntN(300)
			if rng.IntN(20) == 0 {
				size = 3000 + rng.IntN(3000) // larger than a small window
			}
			payload := make([]byte, size)
			for k := range payload {
				payload[k] = byte(rng.UintN(256))
			}
			payload[0] = 'x' // never a close marker
			file = AppendRecord(file, payload)
		}
		SealBatch(file[off:], uint64(i+1), int64(off), salt)
	}
	if marked {
		off := len(file)
		offs = append(offs, int64(off))
		file = append(file, make([]byte, BatchHeaderLen)...)
		file = AppendRecord(file, closeMarker(uint64(batches)))
		SealBatch(file[off:], uint64(batches+1), int64(off), salt)
	}
	return file, offs
}

// raOutcome is everything a replay tells its caller.
type raOutcome struct {
	records []string
	res     Replayed
	err     string
}

// raDigest is a DigestFunc for the tests: a payload whose second byte is
// 'E' (one in 256 of raFile's) is refused, any other digested to its
// length and its reversed first bytes.
func raDigest(dst, p []byte) ([]byte, error) {
	if len(p) > 1 && p[1] == 'E' {
		return dst, errors.New("digest refused")
	}
	dst = append(dst, byte(len(p)), byte(len(p)>>8))
	for i := min(len(p), 16) - 1; i >= 0; i-- {
		dst = append(dst, p[i])
	}
	return dst, nil
}

// raReplayDigest replays data with the read-ahead's window set to window
// (0: no read-ahead) and digest, failing apply at record failAt (-1:
// never).
func raReplayDigest(t *testing.T, data []byte, salvage bool, window, failAt int, digest DigestFunc) raOutcome {
	t.Helper()
	saved := readAheadWindow
	defer func() { readAheadWindow = saved }()
	if window == 0 {
		readAheadWindow = 1 << 40
	} else {
		readAheadWindow = window
	}
	var out raOutcome
	res, err := replay(bytes.NewReader(data), int64(len(data)), salvage, func(off int64, n int, p []byte) error {
		out.records = append(out.records, fmt.Sprintf("%d/%d/%x", off, n, p))
		if len(out.records)-1 == failAt {
			return errors.New("apply refused")
		}
		return nil
	}, digest, nil)
	if err != nil {
		out.err = err.Error()
	}
	if res != nil {
		out.res = *res
	}
	return out
}

// TestReplayReadAheadChangesNothing checks that reading ahead on its own
// goroutine changes nothing replay decides: for intact files, damage at
// every batch, tails cut at many points, batches out of sequence and an
// apply that fails, with and without salvage, replay with windows much
// smaller than the file (so every path of the read-ahead runs: batches cut
// by a window's end, batches larger than a window, the hand-over to
// replay's own reads at the first batch it would not accept) gives the
// same records, the same result and the same error as replay without it.
// (With the read-ahead's sequence check removed, or its records' checks,
// it fails: checked both.) Each case runs with a DigestFunc too (the
// read-ahead then digests the records, and a refused digest makes replay
// judge that batch itself); with the read-ahead handing over a batch
// whose digest was refused it fails (checked). goleak, in TestMain,
// checks that no read-ahead outlives its replay.
func TestReplayReadAheadChangesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	check := func(t *testing.T, name string, data []byte, failAt int) {
		t.Helper()
		for _, salvage := range []bool{false, true} {
			for _, digest := range []DigestFunc{nil, raDigest} {
				want := raReplayDigest(t, data, salvage, 0, failAt, digest)
				for _, window := range []int{BatchHeaderLen, 1000, 4096} {
					if int64(len(data)) < 2*int64(window) {
						continue
					}
					got := raReplayDigest(t, data, salvage, window, failAt, digest)
					require.Equal(t, want, got, "%s, salvage %v, digest %v, window %d", name, salvage, digest != nil, window)
				}
			}
		}
	}
	for round := range 2 {
		data, offs := raFile(rng, 40, round%2 == 0)
		check(t, "intact", data, -1)
		check(t, "apply fails", data, rng.IntN(60))
		for i, off := range offs {
			damaged := bytes.Clone(data)
			damaged[off+int64(rng.IntN(BatchHeaderLen+8))] ^= 0x40
			check(t, fmt.Sprintf("batch %d damaged", i), damaged, -1)
		}
		for range 12 {
			cut := FileHeaderLen + rng.IntN(len(data)-FileHeaderLen)
			check(t, fmt.Sprintf("cut at %d", cut), data[:cut], -1)
		}
		salt, err := CheckFileHeader(data[:FileHeaderLen])
		require.NoError(t, err)
		// Batches out of sequence: two swapped, each sealed again for its
		// new place with its own sequence number.
		for range 4 {
			i := rng.IntN(len(offs) - 2)
			a, b, c := offs[i], offs[i+1], offs[i+2]
			swapped := append(append(append(bytes.Clone(data[:a]), data[b:c]...), data[a:b]...), data[c:]...)
			SealBatch(swapped[a:a+(c-b)], uint64(i+2), a, salt)
			SealBatch(swapped[a+(c-b):c], uint64(i+1), a+(c-b), salt)
			check(t, fmt.Sprintf("batches %d and %d swapped", i, i+1), swapped, -1)
		}
		// A record whose digest is refused.
		for range 4 {
			i := rng.IntN(len(offs) - 1)
			refused := bytes.Clone(data)
			refused[offs[i]+BatchHeaderLen+RecordHeaderLen+1] = 'E'
			bt := refused[offs[i]:offs[i+1]]
			// The record's CRC and the batch's, made again.
			rec := bt[BatchHeaderLen:]
			FinishRecord(rec[:RecordHeaderLen+int(binary.LittleEndian.Uint32(rec))])
			SealBatch(bt, uint64(i+1), offs[i], salt)
			check(t, fmt.Sprintf("digest of batch %d refused", i), refused, -1)
		}
		// A record that fails its CRC in a batch that passes its own: a
		// batch written that way.
		for range 4 {
			i := rng.IntN(len(offs) - 1)
			bad := bytes.Clone(data)
			bad[offs[i]+BatchHeaderLen+RecordHeaderLen] ^= 0x01
			SealBatch(bad[offs[i]:offs[i+1]], uint64(i+1), offs[i], salt)
			check(t, fmt.Sprintf("record of batch %d damaged", i), bad, -1)
		}
	}
}
