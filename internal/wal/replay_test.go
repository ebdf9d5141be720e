package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replayBytes replays the journal file f and returns what it found and
// the records it passed on.
func replayBytes(f []byte, salvage bool) (*Replayed, *collect, error) {
	var c collect
	res, err := Replay(bytes.NewReader(f), int64(len(f)), salvage, c.apply)
	return res, &c, err
}

// marker is the batch a clean close appends, numbered seq.
func marker(seq uint64) []byte { return batch(seq, AppendRecord(nil, closeMarker(seq))) }

func TestReplay(t *testing.T) {
	a, b, c, d := rec("Ba"), rec("Bbb"), rec("Fa"), rec("Bc")
	b1, b2, b3 := batch(1, a, b), batch(2, c), batch(3, d)
	f := file(b1, b2, b3)

	res, got, err := replayBytes(f, false)
	require.NoError(t, err)
	assert.Equal(t, &Replayed{Salt: testSalt, Version: Version, Seq: 3, End: int64(len(f))}, withoutLast(t, res))
	assert.Equal(t, []string{"Ba", "Bbb", "Fa", "Bc"}, got.payloads, "every record, in order")
	o1 := int64(FileHeaderLen + BatchHeaderLen)
	o2 := int64(FileHeaderLen + len(b1) + BatchHeaderLen)
	o3 := int64(FileHeaderLen + len(b1) + len(b2) + BatchHeaderLen)
	assert.Equal(t, []int64{o1, o1 + int64(len(a)), o2, o3}, got.offs)
	assert.Equal(t, []int{len(a), len(b), len(c), len(d)}, got.sizes)
	for i, off := range got.offs {
		p, n, ok := ReadRecord(f[off : off+int64(got.sizes[i])])
		require.True(t, ok, "the record at %d reads back where replay said", off)
		assert.Equal(t, got.sizes[i], n)
		assert.Equal(t, got.payloads[i], string(p))
	}

	// Only the first size bytes are read: a writer may be appending.
	size := int64(FileHeaderLen + len(b1))
	var part collect
	res, err = Replay(bytes.NewReader(f), size, false, part.apply)
	require.NoError(t, err)
	assert.Equal(t, &Replayed{Salt: testSalt, Version: Version, Seq: 1, End: size}, withoutLast(t, res))
	assert.Equal(t, []string{"Ba", "Bbb"}, part.payloads)

	res, got, err = replayBytes(FileHeader(testSalt), false)
	require.NoError(t, err)
	assert.Equal(t, &Replayed{Salt: testSalt, Version: Version, End: FileHeaderLen}, withoutLast(t, res))
	assert.Empty(t, got.payloads)
}

// An error from apply stops the replay, saying where; salvage ignores it
// and goes on with the next record.
func TestReplayApplyError(t *testing.T) {
	f := file(batch(1, rec("Ba"), rec("Bbad"), rec("Bc")), batch(2, rec("Bd")))
	refused := errors.New("contradicts what came before")
	apply := func(c *collect) ApplyFunc {
		return func(off int64, n int, p []byte) error {
			if string(p) == "Bbad" {
				return refused
			}
			return c.apply(off, n, p)
		}
	}
	var c collect
	res, err := Replay(bytes.NewReader(f), int64(len(f)), false, apply(&c))
	assert.Nil(t, res)
	assert.ErrorIs(t, err, refused)
	badAt := FileHeaderLen + BatchHeaderLen + len(rec("Ba"))
	assert.ErrorContains(t, err, fmt.Sprintf("batch at offset %d: record at offset %d", FileHeaderLen, badAt))

	c = collect{}
	res, err = Replay(bytes.NewReader(f), int64(len(f)), true, apply(&c))
	require.NoError(t, err)
	assert.Equal(t, []string{"Ba", "Bc", "Bd"}, c.payloads)
	assert.Zero(t, res.Skipped)
}

// A batch that passes its CRC was acknowledged: damage inside it, a gap
// before it, or damage between it and the batch before it is corruption,
// refused; salvage skips it and goes on.
func TestReplayRefusesDamage(t *testing.T) {
	a, b, c := rec("Ba"), rec("Bb"), rec("Bc")
	gap := batch(3, b)
	back := batch(5, b)
	damaged := flip(batch(2, b), BatchHeaderLen+9)
	tests := []struct {
		name        string
		give        []byte
		wantErr     string
		wantRecords []string // after salvage
		wantSkipped int64    // after salvage
	}{
		// Salvage keeps the records before the bad one, and drops the rest
		// of that batch: nothing says where the next record starts.
		{name: "record failing its CRC", give: file(batch(1, a, flip(b, len(b)-1), c), batch(2, b)), wantErr: "bad record", wantRecords: []string{"Ba", "Bb"}},
		{name: "record of length 0", give: file(batch(1, a, AppendRecord(nil, nil), c)), wantErr: "bad record", wantRecords: []string{"Ba"}},
		{name: "record running past its batch", give: file(batch(1, a, c[:len(c)-1])), wantErr: "bad record", wantRecords: []string{"Ba"}},
		{name: "sequence gap", give: file(batch(1, a), gap, batch(4, c)), wantErr: "sequence number 3, want 2", wantRecords: []string{"Ba", "Bc"}, wantSkipped: int64(len(gap))},
		{name: "sequence going back", give: file(batch(5, a), back, batch(6, c)), wantErr: "sequence number 5, want 6", wantRecords: []string{"Ba", "Bc"}, wantSkipped: int64(len(back))},
		{name: "damaged batch, then a valid one", give: file(batch(1, a), damaged, batch(3, c)), wantErr: "damaged batch at offset", wantRecords: []string{"Ba", "Bc"}, wantSkipped: int64(len(damaged))},
		{name: "damaged first batch, then a valid one", give: file(flip(batch(1, a), 3), batch(2, c)), wantErr: "damaged batch at offset 24,", wantRecords: []string{"Bc"}, wantSkipped: int64(len(batch(1, a)))},
		{name: "garbage between batches", give: file(batch(1, a), []byte("garbage"), batch(2, c)), wantErr: "damaged batch", wantRecords: []string{"Ba", "Bc"}, wantSkipped: 7},
		// The marker a clean close writes is what makes damage to the last
		// data batch visible (see TestReplayCloseMarker).
		{name: "damaged last data batch, then the close marker", give: file(batch(1, a), damaged, marker(3)), wantErr: "damaged batch", wantRecords: []string{"Ba"}, wantSkipped: int64(len(damaged))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, _, err := replayBytes(tt.give, false)
			assert.Nil(t, res)
			assert.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, tt.wantErr)

			res, got, err := replayBytes(tt.give, true)
			require.NoError(t, err, "salvage skips damage")
			assert.Equal(t, tt.wantRecords, got.payloads)
			assert.Equal(t, tt.wantSkipped, res.Skipped)
			assert.Zero(t, res.Truncated)
			assert.Equal(t, int64(len(tt.give)), res.End)
		})
	}
}

// Regression: with salvage, a last batch that passes its CRC but breaks
// the sequence was cut off as a torn tail (and the journal truncated it
// away) instead of being skipped like the same batch with another after
// it.
func TestReplaySalvageSkipsAGapInTheLastBatch(t *testing.T) {
	gap := batch(3, rec("Bb"))
	f := file(batch(1, rec("Ba")), gap)

	_, _, err := replayBytes(f, false)
	assert.ErrorIs(t, err, ErrCorrupt, "not a torn tail: it passes its CRC")

	res, got, err := replayBytes(f, true)
	require.NoError(t, err)
	assert.Equal(t, []string{"Ba"}, got.payloads)
	assert.Zero(t, res.Truncated, "a batch that passes its CRC is never cut off")
	assert.Equal(t, int64(len(gap)), res.Skipped)
	assert.Equal(t, int64(len(f)), res.End)
}

// A damaged or incomplete last batch, with nothing valid after it, is a
// group commit a crash interrupted before any caller was told it
// succeeded: it is cut off, with or without salvage, and none of its
// records is passed on.
func TestReplayCutsTornTail(t *testing.T) {
	b1 := batch(1, rec("Ba"))
	last := batch(2, rec("Bb"), rec("Fa"))
	head := file(b1)
	// A valid batch, sealed where it lies, whose number is not after the
	// last one's: a stale batch (from before a rewrite, say) is no proof
	// that the damage before it was acknowledged.
	stale := func(before []byte) []byte {
		s := batch(1, rec("Bstale"))
		SealBatch(s, 1, int64(len(head)+len(before)), testSalt)
		return cat(before, s)
	}
	tests := []struct {
		name string
		give []byte // what follows b1
	}{
		{name: "zeros", give: make([]byte, 100)},
		{name: "one byte", give: []byte{0x49}},
		{name: "flipped byte", give: flip(last, len(last)/2)},
		{name: "flipped CRC", give: flip(last, 16)},
		{name: "batch, then damage", give: cat(flip(last, 30), []byte("more"))},
		{name: "stale batch number", give: stale(flip(last, 30))},
		{name: "sealed for the offset after", give: func() []byte {
			b := bytes.Clone(last)
			SealBatch(b, 2, int64(len(head)+1), testSalt)
			return b
		}()},
	}
	for n := 1; n < len(last); n++ {
		tests = append(tests, struct {
			name string
			give []byte
		}{name: fmt.Sprintf("cut at %d", n), give: last[:n]})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := cat(head, tt.give)
			for _, salvage := range []bool{false, true} {
				res, got, err := replayBytes(f, salvage)
				require.NoError(t, err, "salvage %v", salvage)
				assert.Equal(t, []string{"Ba"}, got.payloads, "nothing of the torn batch is applied")
				torn := tornLen(tt.give)
				assert.Equal(t, &Replayed{Salt: testSalt, Version: Version, Seq: 1, End: int64(len(head)), Truncated: torn, Free: int64(len(tt.give)) - torn}, withoutLast(t, res))
			}
		})
	}
}

// Regression: a request body is stored verbatim, so a record's payload
// can hold the bytes of a whole batch. When the batch holding it is torn
// by a crash, replay must still cut the tail off: neither take the batch
// inside the payload for proof of damage to acknowledged data (refusing
// to open), nor pass its records on (with salvage, which would plant an
// entry that Resume sends). The salt and the offset in the batch CRC are
// what stop it; the control shows the same bytes sealed with the file's
// salt where they lie are taken for a batch.
func TestReplayTornTailHidingABatch(t *testing.T) {
	b1 := batch(1, rec("Ba"))
	inner := rec("Bforged")
	// The payload: "B{", the forged batch, "}"; its record is the only one
	// of batch 2, so the forged batch starts at this offset.
	at := int64(FileHeaderLen + len(b1) + BatchHeaderLen + RecordHeaderLen + 2)
	build := func(salt uint64, off int64) []byte {
		forged := batch(1<<40, inner)
		SealBatch(forged, 1<<40, off, salt)
		torn := batch(2, rec("B{"+string(forged)+"}"))
		f := file(b1, torn)
		require.Equal(t, forged, f[at:at+int64(len(forged))])
		return f[:len(f)-1] // the crash cut the write short
	}
	tests := []struct {
		name string
		salt uint64
		off  int64
	}{
		{name: "another file's salt", salt: testSalt + 0x9e3779b97f4a7c15, off: at},
		{name: "the file's magic, another salt", salt: testSalt ^ 1<<40, off: at},
		{name: "the file's salt, another offset", salt: testSalt, off: at + 1},
		{name: "the file's salt, offset 0", salt: testSalt, off: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := build(tt.salt, tt.off)
			for _, salvage := range []bool{false, true} {
				res, got, err := replayBytes(f, salvage)
				require.NoError(t, err, "salvage %v: a torn tail is not damage", salvage)
				assert.Equal(t, []string{"Ba"}, got.payloads, "nothing from inside the payload is passed on")
				assert.Equal(t, int64(len(f)-FileHeaderLen-len(b1)), res.Truncated)
			}
		})
	}
	t.Run("control: the file's salt where it lies", func(t *testing.T) {
		_, _, err := replayBytes(build(testSalt, at), false)
		assert.ErrorIs(t, err, ErrCorrupt)
		assert.ErrorContains(t, err, fmt.Sprintf("followed by a valid one at offset %d", at))
	})
}

// Replay reads the file a batch at a time and searches past damage a
// window at a time: a batch whose magic straddles a window edge is found
// all the same.
func TestReplayFindsABatchAcrossWindows(t *testing.T) {
	b1 := batch(1, rec("Ba"))
	b3 := batch(3, rec("Bc"))
	for _, garbage := range []int{FindWindow - 6, FindWindow - 4, FindWindow - 3, FindWindow - 2, FindWindow - 1, FindWindow, FindWindow + 1} {
		t.Run(fmt.Sprint(garbage), func(t *testing.T) {
			f := file(b1, bytes.Repeat([]byte{0xaa}, garbage), b3)
			want := FileHeaderLen + len(b1) + garbage
			_, _, err := replayBytes(f, false)
			assert.ErrorContains(t, err, fmt.Sprintf("followed by a valid one at offset %d", want))
			res, got, err := replayBytes(f, true)
			require.NoError(t, err)
			assert.Equal(t, []string{"Ba", "Bc"}, got.payloads)
			assert.Equal(t, int64(garbage), res.Skipped)
		})
	}
}

// A clean close appends a batch holding one record of the payload 0x00:
// replay does not pass it on, and reports Clean when it is the last thing
// in the file. Checked to fail with the marker treated as a record.
func TestReplayCloseMarker(t *testing.T) {
	a, c := rec("Ba"), rec("Bc")
	tests := []struct {
		name        string
		give        []byte
		wantRecords []string
		wantSeq     uint64
		wantClean   bool
		wantTorn    int64
	}{
		{name: "closed cleanly", give: file(batch(1, a), marker(2)), wantRecords: []string{"Ba"}, wantSeq: 2, wantClean: true},
		{name: "closed cleanly with nothing written", give: file(marker(1)), wantSeq: 1, wantClean: true},
		{name: "reopened and written after", give: file(batch(1, a), marker(2), batch(3, c)), wantRecords: []string{"Ba", "Bc"}, wantSeq: 3},
		{name: "reopened, written and closed again", give: file(batch(1, a), marker(2), batch(3, c), marker(4)), wantRecords: []string{"Ba", "Bc"}, wantSeq: 4, wantClean: true},
		{name: "a torn batch after it", give: cat(file(batch(1, a), marker(2)), batch(3, c)[:9]), wantRecords: []string{"Ba"}, wantSeq: 2, wantTorn: 9},
		// A marker is a batch of that one record: a zero byte among other
		// records, or twice, is the layer above's, and passed on.
		{name: "a zero payload among records", give: file(batch(1, a, rec("\x00"))), wantRecords: []string{"Ba", "\x00"}, wantSeq: 1},
		{name: "two zero payloads", give: file(batch(1, rec("\x00"), rec("\x00"))), wantRecords: []string{"\x00", "\x00"}, wantSeq: 1},
		{name: "a longer payload starting with 0", give: file(batch(1, rec("\x00\x00"))), wantRecords: []string{"\x00\x00"}, wantSeq: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, got, err := replayBytes(tt.give, false)
			require.NoError(t, err)
			assert.Equal(t, tt.wantRecords, got.payloads)
			assert.Equal(t, tt.wantSeq, res.Seq)
			assert.Equal(t, tt.wantClean, res.Clean)
			assert.Equal(t, tt.wantTorn, res.Truncated)
		})
	}

	// What the marker is for: damage in the last data batch. Without a
	// marker after it, it cannot be told from a torn write and is cut off;
	// with one, it is damage to acknowledged data, and refused.
	damaged := flip(batch(2, c), BatchHeaderLen+9)
	res, _, err := replayBytes(file(batch(1, a), damaged), false)
	require.NoError(t, err)
	assert.Equal(t, int64(len(damaged)), res.Truncated)
	_, _, err = replayBytes(file(batch(1, a), damaged, marker(3)), false)
	assert.ErrorIs(t, err, ErrCorrupt)
}

// zeroTail is a file of head, then zeros up to size, without the memory.
type zeroTail struct {
	head []byte
	size int64
}

func (z zeroTail) ReadAt(p []byte, off int64) (int, error) {
	if off >= z.size {
		return 0, io.EOF
	}
	want, err := len(p), error(nil)
	if int64(want) > z.size-off {
		want, err = int(z.size-off), io.EOF
	}
	n := 0
	if off < int64(len(z.head)) {
		n = copy(p[:want], z.head[off:])
	}
	clear(p[n:want])
	return want, err
}

// A damaged length cannot make replay allocate or skip gigabytes: a batch
// header claiming more than MaxBatch is not read, even in a file large
// enough to hold it. Checked to fail (a 1 GiB allocation) with the bound
// removed from the batch reader.
func TestReplayBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("scans 1 GiB")
	}
	head := file(batch(1, rec("Ba")))
	end := int64(len(head))
	head = binary.LittleEndian.AppendUint32(head, Magic(testSalt))
	head = binary.LittleEndian.AppendUint32(head, MaxBatch+1)
	head = binary.LittleEndian.AppendUint64(head, 2)
	head = binary.LittleEndian.AppendUint32(head, 0)
	r := zeroTail{head: head, size: int64(len(head)) + MaxBatch + 1}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var c collect
	res, err := Replay(r, r.size, false, c.apply)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	assert.Equal(t, []string{"Ba"}, c.payloads)
	assert.Equal(t, end, res.End)
	assert.Positive(t, res.Truncated, "the oversized batch is a torn tail")
	assert.Equal(t, r.size-end, res.Truncated+res.Free, "and the zeros after it, free space")
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(16<<20), "bytes allocated")
}

// seedFiles are the journal files, after their header, that seed
// FuzzReplay besides its corpus (journal files written by the layer
// above, in testdata/fuzz/FuzzReplay).
func seedFiles() [][]byte {
	a, b, c := rec("Ba"), rec("Bbb"), rec("Fa")
	b1, b2, b3 := batch(1, a, b), batch(2, c), batch(3, a)
	return [][]byte{
		file(b1, b2, marker(3)),
		file(b1, marker(2), b3, marker(4)),
		file(b1, flip(b2, 25), b3),
		file(b1, b2[:len(b2)-3]),
		file(b1, batch(3, c)),
		file(b1, []byte("garbage"), b3),
		file(batch(1, a, rec("\x00"), c)),
		// A preallocated tail: zeros after the last batch, after a
		// marker, after a torn batch.
		cat(file(b1, b2), make([]byte, 64)),
		cat(file(b1, marker(2)), make([]byte, 64)),
		cat(file(b1, b2[:len(b2)-3]), make([]byte, 64)),
	}
}

// FuzzReplay checks that replay never panics, with or without salvage;
// that whatever it refuses wraps ErrCorrupt; that the records it passes on
// are whole, in order and inside the valid part of the file; and that
// cutting off what it calls torn changes nothing, which is what Open does.
// The fuzzer cannot forge CRCs, so each input is also replayed with the
// CRCs of its batches and records recomputed. Inputs are what follows a
// file header salted with testSalt.
func FuzzReplay(f *testing.F) {
	for _, s := range seedFiles() {
		f.Add(s[FileHeaderLen:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file := cat(FileHeader(testSalt), data)
		for _, salvage := range []bool{false, true} {
			checkReplay(t, file, salvage)
			checkReplay(t, reseal(file), salvage)
		}
	})
}

// reseal returns a copy of f with the CRC of every batch that starts with
// the batch magic and fits in the file recomputed, and the CRCs of the
// records in it that fit.
func reseal(f []byte) []byte {
	b := bytes.Clone(f)
	for off := FileHeaderLen; off+BatchHeaderLen <= len(b); {
		size := int(binary.LittleEndian.Uint32(b[off+4:]))
		if binary.LittleEndian.Uint32(b[off:]) != Magic(testSalt) || size == 0 || size > len(b)-off-BatchHeaderLen {
			off++
			continue
		}
		batch := b[off : off+BatchHeaderLen+size]
		records := batch[BatchHeaderLen:]
		for p := 0; p+RecordHeaderLen <= len(records); {
			n := int(binary.LittleEndian.Uint32(records[p:]))
			if n == 0 || n > len(records)-p-RecordHeaderLen {
				break
			}
			FinishRecord(records[p : p+RecordHeaderLen+n])
			p += RecordHeaderLen + n
		}
		SealBatch(batch, binary.LittleEndian.Uint64(batch[8:]), int64(off), testSalt)
		off += len(batch)
	}
	return b
}

// checkReplay replays f and checks what it found.
func checkReplay(t *testing.T, f []byte, salvage bool) {
	res, got, err := replayBytes(f, salvage)
	if err != nil {
		require.False(t, salvage, "salvage never refuses: %v", err)
		require.ErrorIs(t, err, ErrCorrupt)
		require.Nil(t, res)
		return
	}
	require.Equal(t, uint64(testSalt), res.Salt)
	require.GreaterOrEqual(t, res.End, int64(FileHeaderLen))
	require.LessOrEqual(t, res.End, int64(len(f)))
	require.Equal(t, int64(len(f))-res.End, res.Truncated+res.Free, "everything after End is cut off, or free")
	// The free space is zeros, and a torn tail ends with a byte that is
	// not: zeros after the last batch are never damage.
	require.Empty(t, bytes.TrimLeft(f[int64(len(f))-res.Free:], "\x00"), "free space is zeros")
	if res.Truncated > 0 {
		require.NotZero(t, f[res.End+res.Truncated-1], "a torn tail ends with what is not a zero")
	}
	require.LessOrEqual(t, res.Skipped, res.End-FileHeaderLen)
	if !salvage {
		require.Zero(t, res.Skipped)
	}
	if res.Clean {
		require.Zero(t, res.Truncated)
		// Also with salvage: a batch after the marker that salvage
		// skips makes the file not end with it (seed
		// marker-then-stale-batch; Clean stayed set before the fix).
		require.True(t, isCloseMarker(f[res.End-RecordHeaderLen-closeMarkerLen:res.End]), "Clean, and the file ends with a marker")
	}
	prev := int64(FileHeaderLen + BatchHeaderLen)
	for i, off := range got.offs {
		n := got.sizes[i]
		require.GreaterOrEqual(t, off, prev, "record %d in order, not overlapping", i)
		require.LessOrEqual(t, off+int64(n), res.End, "record %d inside the valid part", i)
		p, m, ok := ReadRecord(f[off : off+int64(n)])
		require.True(t, ok, "record %d reads back at %d", i, off)
		require.Equal(t, n, m)
		require.Equal(t, got.payloads[i], string(p))
		prev = off + int64(n)
	}

	// Cutting the tail off, as Open does, leaves the same log.
	cut, again, err := replayBytes(f[:res.End], salvage)
	require.NoError(t, err)
	require.Equal(t, got, again)
	want := *res
	want.Truncated, want.Free = 0, 0
	want.Clean = cut.Clean // a cut file may now end with a marker
	require.Equal(t, &want, cut)

	if !salvage {
		// Nothing to salvage: salvage finds the same.
		sres, sgot, err := replayBytes(f, true)
		require.NoError(t, err)
		require.Equal(t, res, sres)
		require.Equal(t, got, sgot)
	}
}

// Regression: looking for a valid batch after a torn one checked the CRC
// of every batch magic found, over as many bytes as it claimed. A
// payload of magics that each claim the rest of the payload made that
// quadratic: a torn 4 MiB request body (this test's) meant a TiB of CRC,
// about a minute, and a torn 64 MiB one (the largest record) hours. The
// magic now depends on the file's salt, which a payload cannot know, so
// such a payload is passed over. Checked to fail (past the limit) with
// the magic unsalted.
func TestReplayTornTailSearchIsLinear(t *testing.T) {
	const size = 4 << 20
	// crafted returns a payload of magic, each claiming as much of the
	// rest of the payload as there is.
	crafted := func(magic uint32) []byte {
		b := make([]byte, 0, size)
		for len(b) < size {
			b = binary.LittleEndian.AppendUint32(b, magic)
			b = binary.LittleEndian.AppendUint32(b, uint32(max(size-len(b)-64, 1)))
		}
		return b
	}
	tests := []struct {
		name string
		give []byte
	}{
		{name: "the unsalted magic", give: crafted(batchMagic)},
		{name: "another file's magic", give: crafted(Magic(testSalt + 0x9e3779b97f4a7c15))},
		// A journal file uploaded: this file's magic, but each batch
		// claiming its own length and sealed for another offset. Each
		// one's CRC is computed, over its own bytes: linear too.
		{name: "batches of this file's salt", give: func() []byte {
			b := make([]byte, 0, size)
			for seq := uint64(5); len(b) < size; seq++ {
				one := batch(seq, rec(fmt.Sprintf("Bk%d", seq)))
				SealBatch(one, seq, int64(len(b)), testSalt)
				b = append(b, one...)
			}
			return b
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := file(batch(1, rec("Ba")), batch(2, rec("B"+string(tt.give))))
			f = f[:len(f)-1] // torn
			type result struct {
				res *Replayed
				err error
			}
			done := make(chan result, 1)
			start := time.Now()
			go func() {
				res, _, err := replayBytes(f, false)
				done <- result{res, err}
			}()
			// Linear, this takes well under a second, even with -race;
			// quadratic (with the magic unsalted), about a minute.
			const limit = 10 * time.Second
			select {
			case r := <-done:
				require.NoError(t, r.err)
				tail := f[FileHeaderLen+len(batch(1, rec("Ba"))):]
				assert.Equal(t, tornLen(tail), r.res.Truncated)
				assert.Equal(t, int64(len(tail)), r.res.Truncated+r.res.Free)
				t.Logf("torn tail of %d bytes replayed in %v", r.res.Truncated, time.Since(start))
			case <-time.After(limit):
				t.Fatalf("a torn tail of %d bytes still replaying after %v", len(f), limit)
			}
		})
	}
}

// withoutLast checks res.Last, the last valid batch, against res and
// returns res without it, for comparing with a literal.
func withoutLast(t *testing.T, res *Replayed) *Replayed {
	t.Helper()
	if res == nil {
		return nil
	}
	got := *res
	assert.Equal(t, res.Seq, res.Last.Seq, "Last")
	if res.Seq != 0 {
		assert.Equal(t, res.End, res.Last.End(), "Last")
		assert.Equal(t, res.Salt, res.Last.Salt, "Last")
	}
	got.Last = Checkpoint{}
	return &got
}

// Salvaging a file with many damaged regions searches past each one
// with the same window: before, every search allocated a MiB of its own
// (gigabytes over a badly damaged file). Checked to fail with the window
// allocated per search.
func TestReplaySalvageReusesItsWindow(t *testing.T) {
	var pieces [][]byte
	for i := range 64 {
		pieces = append(pieces, batch(uint64(2*i+1), rec("Bgood")), flip(batch(uint64(2*i+2), rec("Bbad")), BatchHeaderLen+9))
	}
	f := file(pieces...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, c, err := replayBytes(f, true)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	assert.Len(t, c.payloads, 64)
	assert.Positive(t, res.Skipped)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8<<20), "allocated for 64 damaged regions")
}

// tornLen is how much of a tail replay takes for a torn write: up to its
// last byte that is not zero; the zeros after it are free space (a
// preallocated tail).
func tornLen(tail []byte) int64 {
	return int64(len(bytes.TrimRight(tail, "\x00")))
}
