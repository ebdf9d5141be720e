package filejournal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/wal"
)

// The index file. Opening a journal of a million entries rebuilds its
// index from the whole file, a gigabyte and more with 1 KiB bodies: about
// a second of two cores. A clean close of a large journal therefore also
// writes the index itself, the few dozen bytes the index keeps of each
// entry, to a file beside the journal (its name with indexSuffix). The
// next open reads that instead, and replays only the batches written
// after the close, if any.
//
// The index file names the close marker it was written after (a
// wal.Checkpoint: the file's salt, the marker's offset, length, sequence
// number, CRC and nonce), and is used only when the journal file holds
// that very batch there. The nonce, random for each close, tells apart
// two copies of one journal that diverged: the same salt, and writes of
// the same sizes, would otherwise end each in a marker identical to the
// other's, and either would accept the other's index file. Every rewrite gives the file a new salt and, in between,
// the file is only appended to, so a file that holds the batch holds, up
// to its end, exactly what it held at the close: the index file is then
// the index of that part, and the batches after it (a later open that
// did not close cleanly, or a build that writes no index file) are
// replayed onto it. Anything else, a file of another salt or of another
// format version, a damaged or short index file, an entry that could not
// be in the journal, is ignored, and the whole journal is replayed as
// before: the journal file stays the one source of truth, and the index
// file is never needed. It is written without a sync, since a torn one is
// refused by its checksums.
//
// What the open no longer does is read every record: damage to the body
// of an old entry is found when the entry is read back (its record's CRC)
// and by Verify (idemctl verify), which still replays the whole file and
// compares it with the index, however it was built.

// indexSuffix follows the journal's name (symlinks resolved) in the
// name of its index file.
const indexSuffix = ".index"

// indexMin is the journal size from which a clean close writes an index
// file: a smaller journal replays in a few milliseconds. A variable for
// the tests.
var indexMin int64 = 8 << 20

// The index file's layout, all integers little-endian:
//
//	header (indexHeaderLen bytes):
//	  magic "idemidx\n", version u32, chunks u32,
//	  checkpoint: salt u64, offset i64, length u32, CRC u32, sequence u64,
//	  nonce u64,
//	  entries u64, high-water mark: seconds i64, nanoseconds u32,
//	  the clock's state (see clockState): set-backs measured i64 (ns),
//	  doubt: seconds i64, nanoseconds u32, the anchor: seconds i64,
//	  nanoseconds u32, boot id (16 bytes), uptime i64 (ns),
//	  CRC u32 of the bytes before it
//	chunks, each: payload length u32, entries u32, CRC u32 of the
//	  payload, then the entries, each:
//	  begin record offset i64, created seconds i64, updated seconds i64,
//	  record length u32, created ns u32, updated ns u32, attempts u32,
//	  last status i32, key length u16, operation length u16, state u8,
//	  then the key and the operation id.
const (
	indexMagic      = "idemidx\n"
	indexVersion    = 3 // 1 named no nonce; 2 held no clock state
	indexHeaderLen  = 136
	indexChunkHdr   = 12
	indexEntryFixed = 49
	indexChunkMax   = 8192    // entries per chunk
	indexChunkBytes = 4 << 20 // the largest chunk payload a reader accepts
)

// errFjIndex is why an index file is not used; it never leaves the
// package: the journal is replayed instead.
var errFjIndex = errors.New("index file refused")

// indexPath is the name of the index file of the journal at path.
func indexPath(fs FS, path string) string {
	if real, err := fs.EvalSymlinks(path); err == nil {
		path = real
	}
	return path + indexSuffix
}

// indexFile is an index file opened for a replay: its header read and
// checked.
type indexFile struct {
	f        File
	cp       wal.Checkpoint
	entries  uint64
	chunks   uint32
	high     [2]int64 // seconds, nanoseconds
	clk      clockState
	badNanos bool // the clock state's nanoseconds are out of range
	loaded   bool // into an index, by resume's load
}

// openFjIndex opens the index file at path and checks its header; nil if
// there is none, or none this build reads.
func openFjIndex(fs FS, path string) *indexFile {
	f, err := fs.OpenFile(path, os.O_RDONLY, 0, false)
	if err != nil {
		return nil
	}
	var h [indexHeaderLen]byte
	if _, err := f.ReadAt(h[:], 0); err != nil || string(h[:8]) != indexMagic ||
		binary.LittleEndian.Uint32(h[8:]) != indexVersion ||
		wal.Checksum(h[:indexHeaderLen-4]) != binary.LittleEndian.Uint32(h[indexHeaderLen-4:]) {
		_ = f.Close()
		return nil
	}
	le := binary.LittleEndian
	return &indexFile{
		f:      f,
		chunks: le.Uint32(h[12:]),
		cp: wal.Checkpoint{
			Salt: le.Uint64(h[16:]), Off: int64(le.Uint64(h[24:])), Len: int(le.Uint32(h[32:])),
			CRC: le.Uint32(h[36:]), Seq: le.Uint64(h[40:]), Nonce: le.Uint64(h[48:]),
		},
		entries: le.Uint64(h[56:]),
		high:    [2]int64{int64(le.Uint64(h[64:])), int64(le.Uint32(h[72:]))},
		clk: clockState{
			off:   time.Duration(le.Uint64(h[76:])),
			doubt: unixTime(int64(le.Uint64(h[84:])), le.Uint32(h[92:])),
			at:    unixTime(int64(le.Uint64(h[96:])), le.Uint32(h[104:])),
			boot:  bootID(h[108:124]),
			up:    time.Duration(le.Uint64(h[124:])),
		},
		badNanos: le.Uint32(h[92:]) >= 1e9 || le.Uint32(h[104:]) >= 1e9,
	}
}

func (x *indexFile) close() {
	if x != nil {
		_ = x.f.Close()
	}
}

// resume is the [wal.Options.Resume] of an open that found x: the
// checkpoint, and what loads the index file into idx.
func (x *indexFile) resume(idx *index) func(uint64) (wal.Checkpoint, func() error, bool) {
	return func(salt uint64) (wal.Checkpoint, func() error, bool) {
		if x == nil || x.cp.Salt != salt {
			return wal.Checkpoint{}, nil, false
		}
		return x.cp, func() error {
			err := x.load(idx)
			x.loaded = err == nil
			return err
		}, true
	}
}

// load reads the index file's entries into idx, which must be empty, and
// leaves it as it was on an error. Entries are decoded by a few
// goroutines a chunk at a time, then the two tables are filled at once,
// each on its own goroutine.
func (x *indexFile) load(idx *index) error {
	// An entry takes indexEntryFixed bytes and more, so the count can
	// not exceed what the file could hold, whatever its header says.
	fi, err := x.f.Stat()
	if err != nil {
		return err
	}
	if x.entries > uint64(fi.Size())/indexEntryFixed || x.high[1] >= 1e9 || x.clk.off < 0 || x.badNanos {
		return errFjIndex
	}
	all := make([]*entry, x.entries)
	type chunk struct {
		buf      *[]byte
		start, n int
	}
	workers := max(1, min(runtime.GOMAXPROCS(0), 4))
	work := make(chan chunk)
	bufs := make(chan *[]byte, workers+1)
	for range workers + 1 {
		b := make([]byte, 0, 1<<20)
		bufs <- &b
	}
	var failed sync.Once
	var loadErr error
	fail := func(err error) { failed.Do(func() { loadErr = err }) }
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				if err := decodeIndexChunk(*c.buf, all[c.start:c.start+c.n], x.cp.End()); err != nil {
					fail(err)
				}
				bufs <- c.buf
			}
		}()
	}
	r := bufio.NewReaderSize(io.NewSectionReader(x.f, indexHeaderLen, fi.Size()-indexHeaderLen), 1<<20)
	read := func() error {
		start := 0
		var h [indexChunkHdr]byte
		for range x.chunks {
			if _, err := io.ReadFull(r, h[:]); err != nil {
				return errFjIndex
			}
			size, n := binary.LittleEndian.Uint32(h[:]), int(binary.LittleEndian.Uint32(h[4:]))
			if size > indexChunkBytes || n == 0 || n > indexChunkMax || n > len(all)-start {
				return errFjIndex
			}
			bp := <-bufs
			b := append((*bp)[:0], make([]byte, size)...)
			*bp = b
			if _, err := io.ReadFull(r, b); err != nil || wal.Checksum(b) != binary.LittleEndian.Uint32(h[8:]) {
				bufs <- bp
				return errFjIndex
			}
			work <- chunk{buf: bp, start: start, n: n}
			start += n
		}
		if start != len(all) {
			return errFjIndex
		}
		if _, err := r.ReadByte(); err != io.EOF {
			return errFjIndex // trailing bytes
		}
		return nil
	}
	if err := read(); err != nil {
		fail(err)
	}
	close(work)
	wg.Wait()
	if loadErr != nil {
		return loadErr
	}

	byKey, byOp := newFjTable(false, len(all)), newFjTable(true, 0)
	var live int64
	ops := 0
	for _, le := range all {
		live += int64(le.size) + entryOverhead
		if int(le.keyLen) < len(le.keyOp) {
			ops++
		}
	}
	if ops > 0 {
		byOp.reserve(ops)
	}
	// The two tables are filled at once: each insert checks that its
	// string is not there already, as replay does.
	var dupKey, dupOp bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, le := range all {
			if int(le.keyLen) < len(le.keyOp) && byOp.insertNew(byOp.hash(le.operation()), le) != nil {
				dupOp = true
				return
			}
		}
	}()
	for _, le := range all {
		if byKey.insertNew(byKey.hash(le.key()), le) != nil {
			dupKey = true
			break
		}
	}
	wg.Wait()
	if dupKey || dupOp {
		return errFjIndex
	}
	idx.byKey, idx.byOp, idx.all, idx.live = byKey, byOp, all, live
	idx.high = unixTime(x.high[0], uint32(x.high[1]))
	idx.clk = x.clk
	return nil
}

// decodeIndexChunk decodes a chunk's payload, which must hold exactly
// len(to) entries, into to. Every entry is checked as replay checks a
// begin record's fields (a valid key, a known state), and must lie in
// the file before end, where the checkpoint's batch ends.
func decodeIndexChunk(b []byte, to []*entry, end int64) error {
	le := binary.LittleEndian
	i := 0
	for len(b) > 0 {
		if len(b) < indexEntryFixed || i == len(to) {
			return errFjIndex
		}
		keyLen, opLen := int(le.Uint16(b[44:])), int(le.Uint16(b[46:]))
		if len(b) < indexEntryFixed+keyLen+opLen {
			return errFjIndex
		}
		e := &entry{
			off: int64(le.Uint64(b)), createdSec: int64(le.Uint64(b[8:])), updatedSec: int64(le.Uint64(b[16:])),
			size: int32(le.Uint32(b[24:])), createdNs: le.Uint32(b[28:]), updatedNs: le.Uint32(b[32:]),
			attempts: int(int32(le.Uint32(b[36:]))), lastStatus: int(int32(le.Uint32(b[40:]))),
			keyLen: uint16(keyLen), state: b[48],
		}
		keyOp := b[indexEntryFixed : indexEntryFixed+keyLen+opLen]
		if e.off < wal.FileHeaderLen || e.size <= wal.RecordHeaderLen || e.off > end-int64(e.size) ||
			e.createdNs >= 1e9 || e.updatedNs >= 1e9 || e.attempts < 0 ||
			e.state < journalStatePending || e.state > journalStateAbandoned ||
			contract.ValidateKey(keyOp[:keyLen]) != nil {
			return errFjIndex
		}
		e.keyOp = string(keyOp)
		to[i] = e
		i++
		b = b[indexEntryFixed+keyLen+opLen:]
	}
	if i != len(to) {
		return errFjIndex
	}
	return nil
}

// writeIndex is the journal's [wal.Options.OnClose]: it writes the index
// file for the checkpoint cp of the close marker, or removes a stale one
// for a journal too small to need one. It is best effort: a journal whose
// index file is missing or refused is replayed in full when opened.
func (j *Journal) writeIndex(cp wal.Checkpoint) {
	// After SkipVerify, the file may hold damage that an index file
	// would hide from the next open, which must refuse it.
	if j.salvage || cp.End() < indexMin {
		_ = j.fs.Remove(j.indexPath)
		return
	}
	if j.indexFrom == cp {
		return // opened from it, and nothing written since: it is the index still
	}
	if err := j.writeIndexFile(cp); err != nil {
		_ = j.fs.Remove(j.indexPath)
	}
}

func (j *Journal) writeIndexFile(cp wal.Checkpoint) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	x, err := j.newIndexWriter(false) // nothing commits after Close
	if err != nil {
		return err
	}
	for _, le := range j.all {
		if le.gone {
			continue
		}
		if le.unsynced || le.deleting {
			// Not what the file holds (a batch that failed would have
			// left the log broken, and this is not called): refuse.
			x.abort()
			return errFjIndex
		}
		off, size := j.placeLocked(le)
		x.add(le, off, size)
	}
	j.clockMu.Lock()
	clk := j.clk
	j.clockMu.Unlock()
	return x.finish(cp, j.high, &clk)
}

// indexWriter writes an index file a chunk at a time, to a temporary
// file beside it that finish renames into place: its memory is a chunk's,
// whatever the number of entries.
type indexWriter struct {
	fs      FS
	f       File
	tmp     string
	path    string
	w       *bufio.Writer
	payload []byte
	count   int    // entries in payload
	n       uint64 // entries in all
	chunks  uint32
	err     error
}

// newIndexWriter starts an index file for the journal. With push, each
// MiB written is pushed to the disk as it goes (see [wal.WriteBack]): for
// a compaction's, written while Begins commit.
//
// It writes to a temporary file beside the index file, "<index
// file>.tmp-<n>", created anew (a compaction's and a close's may be
// written at once, and a crashed process may have left one behind) and
// numbered by the journal, so that it is named the same on every run, as
// everything the journal writes through a simulated disk must be.
func (j *Journal) newIndexWriter(push bool) (*indexWriter, error) {
	return newFjIndexWriter(j.fs, j.indexPath, &j.indexTemps, push)
}

// newFjIndexWriter starts an index file at path on fs, numbering its
// temporary file with temps.
func newFjIndexWriter(fs FS, path string, temps *atomic.Uint64, push bool) (*indexWriter, error) {
	f, tmp, err := wal.CreateNew(fs, func(int) string {
		return path + ".tmp-" + strconv.FormatUint(temps.Add(1), 10)
	})
	if err != nil {
		return nil, err
	}
	var w io.Writer = io.NewOffsetWriter(f, 0)
	if push {
		w = &pushWriter{f: f}
	}
	x := &indexWriter{fs: fs, f: f, tmp: tmp, path: path, w: bufio.NewWriterSize(w, 1<<20), payload: make([]byte, 0, 1<<20)}
	// The header goes in last, when the checkpoint is known.
	_, x.err = x.w.Write(make([]byte, indexHeaderLen))
	return x, nil
}

// pushWriter writes to f, from its start on, and pushes what it wrote
// to the disk.
type pushWriter struct {
	f   File
	off int64
}

func (w *pushWriter) Write(p []byte) (int, error) {
	n, err := w.f.WriteAt(p, w.off)
	if err == nil {
		err = wal.WriteBack(w.f, w.off, int64(n))
	}
	w.off += int64(n)
	return n, err
}

// add adds the entry whose begin record is at off, size bytes long.
func (x *indexWriter) add(e *entry, off int64, size int32) {
	if x.err != nil {
		return
	}
	if e.attempts > math.MaxInt32 || e.lastStatus > math.MaxInt32 || e.lastStatus < math.MinInt32 {
		x.err = errFjIndex // too large for the format: replay instead
		return
	}
	bo := binary.LittleEndian
	p := x.payload
	p = bo.AppendUint64(p, uint64(off))
	p = bo.AppendUint64(p, uint64(e.createdSec))
	p = bo.AppendUint64(p, uint64(e.updatedSec))
	p = bo.AppendUint32(p, uint32(size))
	p = bo.AppendUint32(p, e.createdNs)
	p = bo.AppendUint32(p, e.updatedNs)
	p = bo.AppendUint32(p, uint32(e.attempts))
	p = bo.AppendUint32(p, uint32(int32(e.lastStatus)))
	p = bo.AppendUint16(p, e.keyLen)
	p = bo.AppendUint16(p, uint16(len(e.keyOp)-int(e.keyLen)))
	p = append(p, e.state)
	x.payload = append(p, e.keyOp...)
	x.n++
	if x.count++; x.count == indexChunkMax {
		x.flush()
	}
}

// flush writes the chunk being filled.
func (x *indexWriter) flush() {
	if x.err != nil || x.count == 0 {
		return
	}
	var ch [indexChunkHdr]byte
	bo := binary.LittleEndian
	bo.PutUint32(ch[:], uint32(len(x.payload)))
	bo.PutUint32(ch[4:], uint32(x.count))
	bo.PutUint32(ch[8:], wal.Checksum(x.payload))
	if _, x.err = x.w.Write(ch[:]); x.err == nil {
		_, x.err = x.w.Write(x.payload)
	}
	x.payload, x.count = x.payload[:0], 0
	x.chunks++
}

// finish writes the header, for the checkpoint cp and the high-water
// mark high, and renames the file into place; on an error, it removes
// it.
func (x *indexWriter) finish(cp wal.Checkpoint, high time.Time, clk *clockState) error {
	x.flush()
	if x.err == nil {
		x.err = x.w.Flush()
	}
	if x.err == nil {
		bo := binary.LittleEndian
		h := make([]byte, 0, indexHeaderLen)
		h = append(h, indexMagic...)
		h = bo.AppendUint32(h, indexVersion)
		h = bo.AppendUint32(h, x.chunks)
		h = bo.AppendUint64(h, cp.Salt)
		h = bo.AppendUint64(h, uint64(cp.Off))
		h = bo.AppendUint32(h, uint32(cp.Len))
		h = bo.AppendUint32(h, cp.CRC)
		h = bo.AppendUint64(h, cp.Seq)
		h = bo.AppendUint64(h, cp.Nonce)
		h = bo.AppendUint64(h, x.n)
		sec, ns := splitTime(high)
		h = bo.AppendUint64(h, uint64(sec))
		h = bo.AppendUint32(h, ns)
		h = bo.AppendUint64(h, uint64(clk.off))
		sec, ns = splitTime(clk.doubt)
		h = bo.AppendUint64(h, uint64(sec))
		h = bo.AppendUint32(h, ns)
		sec, ns = splitTime(clk.at)
		h = bo.AppendUint64(h, uint64(sec))
		h = bo.AppendUint32(h, ns)
		h = append(h, clk.boot[:]...)
		h = bo.AppendUint64(h, uint64(clk.up))
		h = bo.AppendUint32(h, wal.Checksum(h))
		_, x.err = x.f.WriteAt(h, 0)
	}
	if err := x.f.Close(); x.err == nil {
		x.err = err
	}
	if x.err == nil {
		x.err = x.fs.Rename(x.tmp, x.path)
	}
	if x.err != nil {
		_ = x.fs.Remove(x.tmp)
	}
	return x.err
}

// abort removes the file.
func (x *indexWriter) abort() {
	_ = x.f.Close()
	_ = x.fs.Remove(x.tmp)
}

// String describes an index file for errors and tests.
func (x *indexFile) String() string {
	return fmt.Sprintf("index file of salt %#x, %d entries up to offset %d", x.cp.Salt, x.entries, x.cp.End())
}
