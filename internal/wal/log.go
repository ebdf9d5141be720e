package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures [Open]. The zero value opens for writing.
type Options struct {
	// ReadOnly opens an existing file for reading only: no lock, no
	// write, no mode change, no repair. The log shows the file as it was
	// when it was opened (a writer's later appends and rewrites are not
	// seen), also while another process writes it and on a read-only
	// mount. A torn tail is ignored, not cut off.
	ReadOnly bool

	// Salvage replays past damage instead of refusing it (see [Replay]).
	Salvage bool

	// OnCommit, when set, is called for every batch once it is on disk,
	// or with the error that stopped it, before anyone waiting for it is
	// woken (write, sync, publish). It runs on the committer with the file
	// held shared: it must not call [Log.Rewrite] or wait for a batch.
	OnCommit func(b *Batch, err error)

	// Digest, when set, makes what apply is given of each record during
	// Open's replay, instead of the payload: for a large file it runs on
	// the read-ahead's goroutine (see [Replay]), so that the work of
	// reading a record's fields overlaps the applying of those before.
	// It must be safe to call from another goroutine than apply's.
	Digest DigestFunc

	// LazyDelay bounds how long a record appended with [Log.AppendLazy]
	// waits in memory when nobody waits for its batch: the committer takes
	// such a batch once a record that someone waits for joins it, on
	// [Log.Flush] or [Log.Close], or LazyDelay after its first lazy record,
	// whichever comes first. Zero means [DefaultLazyDelay]; a negative
	// value makes lazy records start a commit like any other.
	LazyDelay time.Duration

	// Resume, when set, lets Open's replay start from a checkpoint
	// instead of the file's first batch: it is asked, once the header is
	// read, for a checkpoint of the file with that salt (see
	// [Checkpoint]). When the batch the checkpoint names is in the file as
	// named (offset, length, sequence number and stored CRC all match),
	// load is called; if it returns nil, apply is given only the records
	// after that batch. Otherwise the replay reads the whole file, as
	// without Resume. load must leave the caller's state as it found it
	// when it fails. Resume is not asked with Salvage.
	Resume func(salt uint64) (cp Checkpoint, load func() error, ok bool)

	// OnClose, when set, is called by [Log.Close] once the close marker
	// is on disk, with the file still locked (no other writer can open
	// it), with the checkpoint of that marker: the whole log as closed.
	// It is not called after a failed write, nor for a read-only log.
	OnClose func(cp Checkpoint)

	// FS is the file system the log's file lives on; nil means [OS].
	// Every file access of the log goes through it: a test puts a
	// simulated disk here (internal/wal/simdisk).
	FS FS

	// Rand is the source of the random salt of every file the log
	// creates (a new file's, a rewrite's) and of the nonce of every close
	// marker; nil means crypto/rand. For tests that need a file's bytes
	// to be the same on every run (the simulator): anyone who can predict
	// a file's salt can craft a request body that passes for a batch of
	// it when replay searches past damage (see docs/journal-format.md).
	Rand io.Reader

	// Clock, when set, replaces time.Now for the name of the file a torn
	// tail is kept in (see [TornSuffix]). For tests.
	Clock func() time.Time

	// Fault, when set, is called before each commit's write ("write"),
	// between the write and its sync ("sync"), when a rewrite has written
	// the live records and starts copying the batches committed meanwhile
	// ("catchup"), and before it syncs the directory ("syncdir"); its
	// error is taken as that step's. For tests.
	Fault func(step string) error
}

// DefaultLazyDelay is [Options.LazyDelay]'s default. A lone caller
// whose next waited-for record follows a lazy one within it shares one
// commit with it; the bound is how long that record may stay only in
// memory otherwise.
const DefaultLazyDelay = 20 * time.Millisecond

// Stats are a log's counters since it was opened.
type Stats struct {
	Writes, Commits, Rewrites uint64
	Truncated, Skipped        int64  // see [Replayed]
	TornPath                  string // where the cut tail was kept, "" if none
	Clean                     bool   // the file had been closed cleanly before this open
	Resumed                   bool   // Open's replay started from a checkpoint: see [Options.Resume]
	Size                      int64  // the durable part of the file
}

// A Checkpoint names one batch of a log file: the last one a caller's
// state, saved elsewhere, already holds. A file is only ever appended to
// between two rewrites, and every rewrite gives it a new salt, so a file
// in which that batch is found as named holds, up to the batch's end,
// exactly what it held when the checkpoint was taken (a cut tail only
// ever removes batches nobody was told were durable; the checkpoints
// [Options.OnClose] gives name a close marker, which was, and those of
// [Writer.Checkpoint] a batch of a rewrite, synced before the rename).
//
// Two copies of one file (a backup restored beside the original, a file
// copied and both copies written since) share the salt, and once they
// diverge may hold at one offset batches of the same length and sequence
// number: after writes of the same sizes, each copy's close marker would
// be byte for byte the other's. A close marker therefore carries a random
// nonce, which its checkpoint names, so that one copy's marker never
// passes for the other's (and the CRC, which covers the nonce, differs
// too). A rewrite's batch needs none: each rewrite draws its own salt.
type Checkpoint struct {
	Salt  uint64 // the file's
	Off   int64  // where the batch starts
	Len   int    // its length, header included
	Seq   uint64 // its sequence number
	CRC   uint32 // the CRC its header stores
	Nonce uint64 // a close marker's nonce, 0 for any other batch
}

// End is where the batch cp names ends.
func (cp Checkpoint) End() int64 { return cp.Off + int64(cp.Len) }

// Log is an append-only file of checksummed records written in batches
// with group commit. It knows nothing of what the records mean. It is
// safe for concurrent use.
type Log struct {
	path string // the file itself, symlinks resolved
	opts Options

	// fileMu guards the file itself: held shared by every read and by the
	// committer for its write and sync, exclusively by Rewrite, which
	// replaces the file. Lock order: fileMu, then the caller's locks, then
	// mu.
	fileMu    sync.RWMutex
	f         File
	rewriteMu sync.Mutex  // one Rewrite at a time: a second would wait on fileMu while the first holds it shared
	fi        os.FileInfo // f's identity, to notice the path naming another file
	fs        FS          // Options.FS, or OS

	mu       sync.Mutex
	cur      *Batch // the batch being filled
	inflight *Batch // the batch being written, nil if none
	closed   bool
	broken   error  // a write or sync failed: the file's tail is unknown, so writes stop
	seq      uint64 // the last durable batch's sequence number
	salt     uint64
	marked   bool       // the file ends with a close marker
	last     Checkpoint // the last durable batch (when marked, the marker)

	kick     chan struct{} // wakes the committer; capacity 1
	stop     chan struct{} // closed by Close
	loopDone chan struct{} // closed when the committer has returned

	// lazyTimer is armed while the batch being filled holds lazy records
	// and nobody waits for it (lazyArmed, guarded by mu), and stopped when
	// the batch is sealed: no timer runs while the log is idle.
	lazyTimer *time.Timer
	lazyArmed bool
	lazyDelay time.Duration // LazyDelay resolved; negative: lazy records are not lazy
	// grouped: the last batch sealed held the records of more than one
	// Append, so callers are concurrent: lazy records are then taken as
	// waited for. Guarded by mu.
	grouped bool

	// alloc is the file's size: its durable part, then the zeros the
	// log wrote ahead of its next batches (see tailFor). The committer's,
	// and Rewrite's with the file held exclusively.
	alloc int64

	writes, commits, rewrites atomic.Uint64
	size                      atomic.Int64
	truncated, skipped        int64
	tornPath                  string
	clean, resumed            bool
}

// Batch is a group of records written and made durable together (one
// group commit).
type Batch struct {
	off  int64  // where the batch goes in the file
	buf  []byte // batch header space, then the records; nil once written
	end  int64  // End, once buf is nil
	done chan struct{}
	err  error // set before done is closed
	// waited: someone waits for the batch (a record appended with Append,
	// a Flush), so the committer takes it as soon as it can. Guarded by
	// the log's mu.
	waited bool
	// appends: records appended with Append (not AppendLazy), whose
	// callers wait for the batch. Guarded by the log's mu.
	appends int
}

// Done is closed once the batch is on disk or failed.
func (b *Batch) Done() <-chan struct{} { return b.done }

// Err is why the batch failed, nil if it is on disk. Valid once Done is
// closed, and in [Options.OnCommit].
func (b *Batch) Err() error { return b.err }

// End is the file offset just past the batch.
func (b *Batch) End() int64 {
	if b.buf == nil {
		return b.end
	}
	return b.off + int64(len(b.buf))
}

func (b *Batch) empty() bool { return len(b.buf) == BatchHeaderLen }

// Open opens the log at path and replays it through apply. For writing,
// it creates the file (mode 0600) if it does not exist or is empty, takes
// its lock without waiting ([ErrLocked]), tightens the mode of a file
// others may read, moves a torn tail aside into a file named after the
// journal with a ".torn-" suffix and the time, and starts the committer.
// A file that is not a journal gives [ErrNotJournal] and is left as it
// was.
func Open(path string, opts *Options, apply ApplyFunc) (*Log, error) {
	l := &Log{kick: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{})}
	if opts != nil {
		l.opts = *opts
	}
	l.path = path
	l.fs = fsOf(&l.opts)
	l.lazyDelay = l.opts.LazyDelay
	if l.lazyDelay == 0 {
		l.lazyDelay = DefaultLazyDelay
	}
	if l.opts.ReadOnly {
		err := l.openReadOnly(apply)
		l.dropResume()
		if err != nil {
			return nil, err
		}
		close(l.loopDone)
		return l, nil
	}
	err := l.open(apply)
	l.dropResume()
	if err != nil {
		return nil, err
	}
	l.lazyTimer = time.NewTimer(time.Hour)
	l.lazyTimer.Stop()
	go l.commitLoop()
	return l, nil
}

// now is Options.Clock, or time.Now.
func (l *Log) now() func() time.Time {
	if l.opts.Clock != nil {
		return l.opts.Clock
	}
	return time.Now
}

// dropResume forgets Options.Resume once Open's replay is over: the
// state its load filled is the caller's to drop, and a log lives as long
// as its journal (a closure kept here kept every entry of the first
// index alive: a prune returned no memory).
func (l *Log) dropResume() { l.opts.Resume = nil }

// openReadOnly opens the file as it is now, without the lock.
func (l *Log) openReadOnly(apply ApplyFunc) error {
	f, fi, err := openViewer(l.fs, l.path)
	if err != nil {
		return err
	}
	res, err := replay(f, fi.Size(), l.opts.Salvage, apply, l.opts.Digest, l.resume())
	if err != nil {
		_ = f.Close()
		return err
	}
	l.f, l.fi = f, fi
	l.setReplayed(res)
	l.closed = false
	l.broken = ErrReadOnly
	return nil
}

// openViewer opens path for reading and takes a read-only open's shared
// lock (see [File.CloseReplaced]), so that a writer that replaces the
// file leaves this one whole. A file being freed refuses the lock: it was
// replaced, so the path is opened again, as it is when the path names
// another file once the lock is held.
func openViewer(fs FS, path string) (File, os.FileInfo, error) {
	for range 10 {
		f, err := fs.OpenFile(path, os.O_RDONLY, 0, false)
		if err != nil {
			return nil, nil, err
		}
		err = f.LockViewer()
		var fi, now os.FileInfo
		if err == nil {
			fi, err = f.Stat()
		}
		if err == nil {
			now, err = fs.Stat(path)
		}
		if err == nil && fs.SameFile(fi, now) {
			return f, fi, nil
		}
		_ = f.Close()
		if err != nil && !errors.Is(err, ErrLocked) && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, err
		}
	}
	return nil, nil, ErrLocked // replaced ten times over
}

// resume is Options.Resume for replay: nil with Salvage, which reads
// the whole file so that it reports all it skips.
func (l *Log) resume() func(uint64) (Checkpoint, func() error, bool) {
	if l.opts.Salvage {
		return nil
	}
	return l.opts.Resume
}

func (l *Log) setReplayed(res *Replayed) {
	l.seq, l.salt = res.Seq, res.Salt
	l.truncated, l.skipped, l.clean, l.marked = res.Truncated, res.Skipped, res.Clean, res.Clean
	l.last, l.resumed = res.Last, res.Resumed
	l.size.Store(res.End)
	l.cur = newBatch(res.End)
}

// open opens, locks and replays the file for writing, creating it if
// needed, and moves a torn tail aside.
func (l *Log) open(apply ApplyFunc) error {
	f, err := openLocked(l.fs, l.path, os.O_RDWR|os.O_CREATE)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		_ = f.Close()
		return err
	}
	// A symlinked journal stays where the link points: rewrites go beside
	// the target and rename over it. Resolved once the file exists, since
	// opening may just have created the target.
	if real, err := l.fs.EvalSymlinks(l.path); err == nil {
		l.path = real
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	size := fi.Size()
	fresh := size < FileHeaderLen // a new file: its header is written and synced here
	if fresh {
		if size, err = initFile(l.fs, l.opts.Rand, f, l.path, size); err != nil {
			return fail(err)
		}
	} else {
		hdr := make([]byte, FileHeaderLen)
		if _, err := f.ReadAt(hdr, 0); err != nil {
			return fail(err)
		}
		if _, err := CheckFileHeader(hdr); err != nil {
			return fail(err) // before anything changes the file
		}
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := f.Chmod(0o600); err != nil {
			return fail(err)
		}
	}
	res, err := replay(f, size, l.opts.Salvage, apply, l.opts.Digest, l.resume())
	if err != nil {
		return fail(err)
	}
	if res.Truncated > 0 {
		torn, err := keepTail(l.fs, l.now(), f, l.path, res.End, res.Truncated)
		if err != nil {
			return fail(fmt.Errorf("keep the torn tail: %w", err))
		}
		l.tornPath = torn
	}
	if !res.Clean && !fresh {
		if err := settle(l.fs, f, l.path, res, size); err != nil && !bugOpenSettle {
			return fail(fmt.Errorf("make the journal's last batch durable: %w", err))
		}
	}
	if res.Version != Version {
		// Before anything of this version is appended: a build of the
		// file's version then refuses it as a whole (ErrVersion), rather
		// than as corrupt at the first record it does not know. The
		// header is 24 bytes at the start of the first sector, which a
		// disk writes whole or not at all (PostgreSQL keeps its control
		// file within 512 bytes for the same reason); the salt stays,
		// so every batch stays valid.
		if _, err := f.WriteAt(fileHeaderWith(Version, res.Salt), 0); err != nil {
			return fail(fmt.Errorf("upgrade the journal's format: %w", err))
		}
		if err := datasync(f); err != nil {
			return fail(fmt.Errorf("upgrade the journal's format: %w", err))
		}
		res.Version = Version
	}
	// A rewrite that a crash interrupted before its rename leaves its
	// temporary file; the journal itself is the old file, intact. Only
	// now, with the lock held, is no other process rewriting.
	if err := l.fs.Remove(l.path + RewriteSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	if fi, err = f.Stat(); err != nil {
		return fail(err)
	}
	l.f, l.fi = f, fi
	l.setReplayed(res)
	l.alloc = fi.Size() // settled: the end of the last batch; clean: and its preallocated zeros
	return nil
}

// settle makes the file f, which a process that did not close it left
// behind, durable as replay found it (res; size bytes long), before
// anything is appended after it: the fsync-gate problem. The last batch
// of such a file may be in the page cache only: a process whose sync of
// it failed (EIO: Linux then marks the pages clean, and no later sync
// writes them again, though reads still see them) and whose truncation
// of it failed too (see [Log.write]) left it there, valid to every read
// until the machine loses power. A batch appended after it and synced
// would then survive a power cut that the batch before it does not: a
// hole before acknowledged batches, and a journal that no longer opens.
//
// Every batch before the last one was made durable by a sync that
// succeeded (the log writes a batch only once the one before it is on
// disk, and stops at the first failure), so the doubt is about the last
// one alone (or the header, in a file without a batch). settle cuts off
// what follows the valid batches (a torn tail, already kept aside, and
// any preallocated space, whose zeros may be as doubtful), writes the
// last batch again, with the very bytes the reads show, so that its
// pages are dirty again, and syncs the file and its directory (whose
// entry a failed directory sync after a rewrite may have left unsynced).
// If that sync succeeds, the file is on disk as the cache shows it;
// if not, the open fails, and nothing was built on it.
//
// A clean close leaves nothing to settle: the close marker is written
// only by a log that never saw a write or sync fail, after the last
// batch's sync succeeded.
func settle(fs FS, f File, path string, res *Replayed, size int64) error {
	if size > res.End {
		if err := f.Truncate(res.End); err != nil {
			return err
		}
	}
	from := int64(0)
	if res.Seq != 0 {
		from = res.Last.Off
	}
	last := make([]byte, res.End-from)
	if _, err := f.ReadAt(last, from); err != nil {
		return err
	}
	if _, err := f.WriteAt(last, from); err != nil {
		return err
	}
	if err := datasync(f); err != nil {
		return err
	}
	return syncDir(fs, path)
}

// TornSuffix starts the name of the file a torn tail is kept in, beside
// the journal, followed by the time it was cut (and, should a file of
// that name exist already, after a clock set back, say, by "." and a
// number).
const TornSuffix = ".torn-"

// keepTail copies the n bytes of f at off into a new file beside path
// and makes it durable, so that cutting them off loses nothing a person
// might need: a tail that is damage rather than a torn write can still be
// examined.
func keepTail(fs FS, now func() time.Time, f File, path string, off, n int64) (string, error) {
	base := path + TornSuffix + now().UTC().Format("20060102T150405.000000000Z")
	t, name, err := CreateNew(fs, func(i int) string {
		if i == 0 {
			return base
		}
		return base + "." + strconv.Itoa(i)
	})
	if err != nil {
		return "", err
	}
	_, err = io.Copy(io.NewOffsetWriter(t, 0), io.NewSectionReader(f, off, n))
	if err == nil {
		err = datasync(t)
	}
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(fs, name)
	}
	if err != nil {
		_ = fs.Remove(name)
		return "", err
	}
	return name, nil
}

// openLocked opens path with mode 0600 (when it creates it), for
// synchronous writes where the FS offers them (see [File.WriteSyncs]),
// and takes its lock without waiting.
//
// A lock is taken on an open file, and Rewrite renames a new file over
// the path: a process that opened the old file just before the rename
// could lock it after its owner let go, and write to a file nobody will
// read again. So the locked file must still be the one the path names;
// if not, it is opened again.
func openLocked(fs FS, path string, flag int) (File, error) {
	for range 10 {
		f, err := fs.OpenFile(path, flag, 0o600, dsync)
		if err != nil {
			return nil, err
		}
		if err := f.Lock(); err != nil {
			_ = f.Close()
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		if now, err := fs.Stat(path); err != nil || !fs.SameFile(fi, now) {
			_ = f.Close() // replaced since it was opened: try the new one
			continue
		}
		return f, nil
	}
	return nil, ErrLocked // replaced ten times over: someone else is busy with it
}

// tornHeader reports whether b, fewer bytes than a file header, is what a
// new file holds before its header is written (nothing), or while: the
// salt is random, so only the magic and the version of a short header can
// be compared.
func tornHeader(b []byte) bool {
	var want [12]byte
	copy(want[:], fileMagic[:])
	binary.LittleEndian.PutUint32(want[8:], Version)
	return len(b) < FileHeaderLen && bytes.HasPrefix(want[:], b[:min(len(b), len(want))])
}

// initFile writes the header of a new journal into f, of size bytes
// (fewer than a header), and returns the file's new size. A file that
// short is empty, or holds a header whose write a crash cut short; the
// salt is random, so only the magic and the version of a short header can
// be compared. Anything else is not a journal, and is left alone.
func initFile(fs FS, rnd io.Reader, f File, path string, size int64) (int64, error) {
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil {
		return 0, err
	}
	if !tornHeader(data) {
		_, err := CheckFileHeader(data)
		return 0, err
	}
	salt, err := random64(rnd)
	if err != nil {
		return 0, err
	}
	hdr := FileHeader(salt)
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return 0, err
	}
	if err := datasync(f); err != nil {
		return 0, err
	}
	if err := syncDir(fs, path); err != nil {
		return 0, err
	}
	return int64(len(hdr)), nil
}

// maxPooledBuf bounds the batch buffers kept for reuse, so that one
// batch of huge bodies does not pin its memory for the process's life.
const maxPooledBuf = 8 << 20

// Bufs is a pool of byte buffers. The zero value is ready to use.
type Bufs struct{ p sync.Pool }

// Get returns a buffer of length 0.
func (p *Bufs) Get() *[]byte {
	if b, ok := p.p.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 64<<10)
	return &b
}

// Put returns b to the pool, unless it grew past what is worth keeping.
func (p *Bufs) Put(b *[]byte) {
	if cap(*b) <= maxPooledBuf {
		*b = (*b)[:0]
		p.p.Put(b)
	}
}

// batchBufs recycles batch buffers: under load every batch holds tens of
// request bodies, and growing a fresh buffer for each was most of the
// journal's allocation.
var batchBufs = &Bufs{}

func newBatch(off int64) *Batch {
	buf := batchBufs.Get()
	return &Batch{off: off, buf: (*buf)[:BatchHeaderLen], done: make(chan struct{})}
}

// Writable reports why no record may be appended now, if so.
func (l *Log) Writable() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writableLocked()
}

func (l *Log) writableLocked() error {
	if l.closed {
		return ErrClosed
	}
	return l.broken
}

// Append adds records to the batch being filled: fn appends them (at
// most need bytes) to the buffer it is given and returns it. It returns
// the batch, and the file offset at which fn's bytes will be, which
// [Log.Rewrite] may move (see its swap). With the batch full, it returns
// it and [ErrBatchFull] without calling fn: wait for the batch and try
// again. Append does not wait for the disk; wait for the batch's Done.
// The committer takes the batch as soon as the previous one is on disk.
func (l *Log) Append(need, records int, fn func([]byte) []byte) (*Batch, int64, error) {
	return l.append(need, records, false, fn)
}

// AppendLazy is [Log.Append] for records nobody waits for (write-behind):
// they join the batch being filled without starting a commit. The batch
// is committed when a record appended with Append joins it, on
// [Log.Flush] or [Log.Close], or [Options.LazyDelay] after its first lazy
// record, whichever comes first. Whoever waits for the batch AppendLazy
// returns must call [Log.Flush] first, or it may wait that long.
func (l *Log) AppendLazy(need, records int, fn func([]byte) []byte) (*Batch, int64, error) {
	return l.append(need, records, l.lazyDelay > 0, fn)
}

func (l *Log) append(need, records int, lazy bool, fn func([]byte) []byte) (*Batch, int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.writableLocked(); err != nil {
		return nil, 0, err
	}
	b := l.cur
	if !b.empty() && len(b.buf)+need > MaxBatch {
		// A batch must stay within what replay accepts. The caller waits
		// for this one before it tries again.
		l.waitedLocked(b)
		return b, 0, ErrBatchFull
	}
	n := len(b.buf)
	b.buf = fn(b.buf)
	l.writes.Add(uint64(records))
	switch {
	case !lazy:
		b.appends++
		l.waitedLocked(b)
	case l.grouped:
		// Concurrent callers (the last commit carried several): lazy
		// records are taken as waited for, so that the committer goes
		// from one commit to the next, each carrying what arrived during
		// the one before. Left to wait for a Begin, it idled between
		// commits, and each one, started by the first Begin to come,
		// carried fewer: at 64 callers 0.095 syncs per request instead
		// of 0.066. A lone caller's records are one per commit, and its
		// outcomes stay lazy.
		l.waitedLocked(b)
	case !b.waited && !l.lazyArmed:
		// The first lazy record of a batch nobody waits for yet: it is
		// committed within the bound even if nobody comes.
		l.lazyArmed = true
		l.lazyTimer.Reset(l.lazyDelay)
	}
	return b, b.off + int64(n), nil
}

// waitedLocked marks b, the batch being filled, as waited for, and wakes
// the committer the first time.
func (l *Log) waitedLocked(b *Batch) {
	if !b.waited {
		b.waited = true
		l.wake()
	}
}

// Pending returns the batch that holds the last records appended, or nil
// if they are all on disk already.
func (l *Log) Pending() *Batch {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pendingLocked()
}

func (l *Log) pendingLocked() *Batch {
	if !l.cur.empty() {
		return l.cur
	}
	return l.inflight
}

func (l *Log) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// commitLoop is the log's one writer. It seals the current batch as soon
// as someone waits for it and the previous one is on disk, so a lone
// caller pays one synchronous write, and under load each one carries every
// record that arrived while the previous one ran. A batch of lazy records
// only waits for company, or for the lazy timer. It runs from Open until
// Close, which it answers by writing what is left and a close marker.
func (l *Log) commitLoop() {
	defer close(l.loopDone)
	for {
		select {
		case <-l.lazyTimer.C:
			// A batch of lazy records has waited LazyDelay for a record
			// someone waits for. (The timer is stopped whenever a batch
			// is sealed, on this goroutine: a tick that arrives is for the
			// batch being filled. Under the timer semantics before Go
			// 1.23, which a main module declaring an older go version
			// gets, a stale tick can still arrive: it only commits a
			// batch early.)
			for force := true; l.commitOne(force); force = false {
			}
		case <-l.kick:
			// Callers that are runnable join the batch before it is
			// sealed: a yield, no timer, and for a lone caller it returns
			// at once. Without it, with one processor (GOMAXPROCS=1, a
			// one-CPU container), the kick makes this goroutine the next
			// to run, it seals each caller's record alone, and the
			// callers behind it never share a commit.
			runtime.Gosched()
			for l.commitOne(false) {
			}
		case <-l.stop:
			for l.commitOne(true) {
			}
			l.mu.Lock()
			mark := l.broken == nil && !l.marked
			if mark {
				// Without a nonce, no marker: the file then ends as if
				// the process had died, which the next open handles.
				nonce, err := random64(l.opts.Rand)
				if mark = err == nil; mark {
					l.cur.buf = AppendRecord(l.cur.buf, closeMarker(nonce))
				}
			}
			l.mu.Unlock()
			if mark {
				l.commitOne(true)
			}
			l.mu.Lock()
			l.lazyTimer.Stop() // stopped already, unless the last batch failed to seal
			l.lazyArmed = false
			l.mu.Unlock()
			return
		}
	}
}

// commitOne writes and syncs the current batch, if it holds anything and
// someone waits for it (or force), and reports whether it did.
//
// Durability order: the batch is written and synced while fileMu is held
// shared (Rewrite, which replaces the file, waits), then OnCommit
// publishes it, and only then are its waiters woken. The next batch is
// written only after this one's sync returned, which is what lets replay
// tell a torn tail from damage.
func (l *Log) commitOne(force bool) bool {
	l.fileMu.RLock()
	defer l.fileMu.RUnlock()
	l.mu.Lock()
	b := l.cur
	if b.empty() || !b.waited && !force {
		l.mu.Unlock()
		return false
	}
	if l.lazyArmed {
		l.lazyTimer.Stop() // the lazy records go now
		l.lazyArmed = false
	}
	l.grouped = b.appends > 1
	l.cur = newBatch(b.End())
	l.inflight = b
	err := l.broken
	seq, salt := l.seq+1, l.salt
	l.mu.Unlock()

	if err == nil {
		err = l.write(b, seq, salt)
	}

	l.mu.Lock()
	b.err = err
	if err != nil {
		// The file's tail is unknown now (a failed fdatasync may have
		// dropped dirty pages), so no later record may depend on it.
		if l.broken == nil {
			l.broken = err
		}
	} else {
		l.seq = seq
		var nonce uint64
		nonce, l.marked = markerNonce(b.buf[BatchHeaderLen:])
		l.last = Checkpoint{Salt: salt, Off: b.off, Len: len(b.buf), Seq: seq, CRC: binary.LittleEndian.Uint32(b.buf[16:]), Nonce: nonce}
		l.size.Store(b.End())
	}
	l.mu.Unlock()
	if l.opts.OnCommit != nil {
		l.opts.OnCommit(b, err)
	}
	buf := b.buf
	b.end, b.buf = b.End(), nil
	batchBufs.Put(&buf)
	close(b.done)
	// Only now: a Flush that finds no batch in flight returns at once,
	// and its caller may then read the batch (End), which the lines
	// above write. (Cleared before them, a Flush could return while they
	// ran: a data race the race detector found in TestLogFlush.)
	l.mu.Lock()
	l.inflight = nil
	l.mu.Unlock()
	return true
}

// tailFor is how many zeros a commit whose batch ends the file at end
// writes after the batch, in the same write: a quarter of the file, at
// most 4 MiB, to a 4 KiB boundary (so the tail grows with the file, and
// a small journal stays small). The batches
// after it then land on blocks already allocated and written, and the
// sync that makes each durable writes its data and nothing else: no new
// size, no new blocks, no journal commit of the file system (ext4 took
// about twice as long to sync a write that grew the file; fallocate's
// unwritten extents are converted at the first write, a journal commit
// again). Replay takes zeros after the last batch for free space.
func tailFor(end int64) int64 {
	n := min(end/4, 4<<20)
	return (end+n+4095)&^4095 - end
}

// write seals, writes and syncs b, and with it the zeros of a new
// preallocated tail when b ends past the one the file has.
func (l *Log) write(b *Batch, seq, salt uint64) error {
	SealBatch(b.buf, seq, b.off, salt)
	buf := b.buf
	if end := b.off + int64(len(buf)); end > l.alloc {
		// Rare (the tail grows with the file): a buffer of its own,
		// not kept, so that a log does not hold megabytes of zeros.
		buf = make([]byte, len(b.buf)+int(tailFor(end)))
		copy(buf, b.buf)
	}
	err := l.step("write")
	if err == nil {
		// The path must still name the file: a journal deleted or
		// replaced underneath would take every later write nowhere.
		if now, serr := l.fs.Stat(l.path); serr != nil || !l.fs.SameFile(l.fi, now) {
			err = ErrReplaced
		}
	}
	if err == nil {
		_, err = l.f.WriteAt(buf, b.off)
	}
	if err == nil {
		if err = l.step("sync"); err == nil && !l.f.WriteSyncs() {
			err = datasync(l.f)
		}
	}
	if len(buf) > len(b.buf) && err == nil {
		l.alloc = b.off + int64(len(buf))
	}
	if err == nil {
		l.commits.Add(1)
		return nil
	}
	if !errors.Is(err, ErrReplaced) {
		// The callers are told this batch failed, so it must not come
		// back when the file is next opened, as it would if the write
		// reached the page cache: cut it off. If that fails too, spoil
		// its header in the cache, which is all the next process on
		// this machine reads (the page cache lies after a failed sync:
		// see settle); after a power cut the batch is gone or torn
		// anyway. If even that fails, the next open may find it whole: a
		// Begin reported failed may reappear, and settle makes it
		// durable before anything is built on it.
		if terr := l.f.Truncate(b.off); terr == nil {
			_ = datasync(l.f)
		} else {
			_, _ = l.f.WriteAt(make([]byte, BatchHeaderLen), b.off)
		}
	}
	return fmt.Errorf("journal writes stopped: %w", err)
}

func (l *Log) step(name string) error {
	if l.opts.Fault == nil {
		return nil
	}
	return l.opts.Fault(name)
}

// Flush returns once every record appended before it was called is on
// disk, with the error of a failed write, or ctx's error if ctx ends
// first.
func (l *Log) Flush(ctx context.Context) error {
	l.mu.Lock()
	if err := l.writableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	b := l.pendingLocked()
	if b == l.cur && b != nil {
		l.waitedLocked(b) // lazy records go now
	}
	l.mu.Unlock()
	if b == nil {
		return nil
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.err
}

// Close writes what is still buffered and a close marker, closes the
// file and releases its lock. It returns the error of that last write,
// or of an earlier one. Close is idempotent; later calls on the log
// return [ErrClosed].
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	if !l.opts.ReadOnly {
		close(l.stop)
	}
	<-l.loopDone
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	l.mu.Lock()
	broken, marked, last := l.broken, l.marked, l.last
	l.mu.Unlock()
	if broken == nil && marked && l.opts.OnClose != nil {
		l.opts.OnClose(last)
	}
	err := l.f.Close()
	if broken != nil && !errors.Is(broken, ErrReadOnly) {
		return broken
	}
	return err
}

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{
		Writes: l.writes.Load(), Commits: l.commits.Load(), Rewrites: l.rewrites.Load(),
		Truncated: l.truncated, Skipped: l.skipped, TornPath: l.tornPath, Clean: l.clean, Resumed: l.resumed,
		Size: l.size.Load(),
	}
}

// Size is the size of the file's durable part.
func (l *Log) Size() int64 { return l.size.Load() }

// FileBusy reports whether the file is held exclusively, or a
// [Log.Rewrite] waits for it. For tests that must know a rewrite waits.
func (l *Log) FileBusy() bool {
	if l.fileMu.TryRLock() {
		l.fileMu.RUnlock()
		return false
	}
	return true
}

// Reader reads records back from the file while [Log.View] holds it.
type Reader struct{ l *Log }

// View calls fn with the file held shared: no [Log.Rewrite] replaces it
// meanwhile, so offsets looked up inside fn stay valid. It returns
// [ErrClosed] after Close.
func (l *Log) View(fn func(r Reader) error) error {
	l.fileMu.RLock()
	defer l.fileMu.RUnlock()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return fn(Reader{l})
}

// Record reads the record of n bytes at off and returns its payload,
// using buf if it is large enough. A record that fails its checksum
// gives an error wrapping [ErrCorrupt].
func (r Reader) Record(off int64, n int, buf []byte) ([]byte, error) {
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := r.l.f.ReadAt(buf, off); err != nil {
		return nil, err
	}
	payload, m, ok := ReadRecord(buf)
	if !ok || m != n {
		return nil, fmt.Errorf("%w: the record at offset %d fails its checksum", ErrCorrupt, off)
	}
	return payload, nil
}

// Replay replays the first size bytes of the file, as [Replay] does.
func (r Reader) Replay(size int64, apply ApplyFunc) (*Replayed, error) {
	return Replay(r.l.f, size, false, apply)
}

// Skipped is the size of the damage skipped when the log was opened,
// until a rewrite drops it.
func (r Reader) Skipped() int64 {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	return r.l.skipped
}

// RewriteSuffix names the temporary file [Log.Rewrite] writes beside the
// journal.
const RewriteSuffix = ".compact"

// rewriteBatch is the size of the batches Rewrite writes.
const rewriteBatch = 4 << 20

// Writer writes the records of a new file during [Log.Rewrite].
type Writer struct {
	f          File
	salt, seq  uint64
	buf        []byte
	off        int64 // of buf[0] in the new file
	batchStart int
	last       Checkpoint // the last batch sealed
}

// WriteBack writes the n bytes of f at off out to the disk and waits for
// them, a MiB at a time, syncing nothing else ([File.WriteBack]; nothing
// in a build that never syncs): for a file written beside a log while
// commits go on, as a rewrite's own writes are, so that a commit's sync
// never waits for much of its dirty data.
func WriteBack(f File, off, n int64) error { return writeBack(f, off, n) }

// Checkpoint seals the batch being filled, writes what is buffered and
// returns the checkpoint of the last batch written, for state saved as
// of the records appended so far (see [Options.Resume]): it names the
// new file, and stands for its records once the rewrite is in place.
// The zero Checkpoint if nothing was appended.
func (w *Writer) Checkpoint() (Checkpoint, error) {
	if err := w.flush(); err != nil {
		return Checkpoint{}, err
	}
	return w.last, nil
}

// Append appends the records fn appends to its buffer (at most need
// bytes) and returns the file offset of the first.
func (w *Writer) Append(need int, fn func([]byte) []byte) (int64, error) {
	if w.batchStart >= 0 && len(w.buf)-w.batchStart+need > rewriteBatch {
		if err := w.flush(); err != nil {
			return 0, err
		}
	}
	if w.batchStart < 0 {
		w.batchStart = len(w.buf)
		w.buf = append(w.buf, make([]byte, BatchHeaderLen)...)
	}
	start := len(w.buf)
	w.buf = fn(w.buf)
	return w.off + int64(start), nil
}

func (w *Writer) flush() error {
	if w.batchStart >= 0 {
		w.seq++
		b := w.buf[w.batchStart:]
		SealBatch(b, w.seq, w.off+int64(w.batchStart), w.salt)
		w.last = Checkpoint{Salt: w.salt, Off: w.off + int64(w.batchStart), Len: len(b), Seq: w.seq, CRC: binary.LittleEndian.Uint32(b[16:])}
		w.batchStart = -1
	}
	if _, err := w.f.WriteAt(w.buf, w.off); err != nil {
		return err
	}
	if err := writeBack(w.f, w.off, int64(len(w.buf))); err != nil {
		return err
	}
	w.off += int64(len(w.buf))
	w.buf = w.buf[:0]
	return nil
}

// Rewrite replaces the file with a new one holding the records fill
// writes, then every batch the old file holds from the offset fill
// returns on, atomically: the new file is written beside the old one,
// synced and renamed over it, so a crash at any point leaves one or the
// other whole.
//
// Writers are held up only at the very end. fill reads the old file
// through r while commits go on; it returns from, the end of the part of
// the old file its records stand for, which must be the end of a batch
// the caller saw committed. The batches committed from there on are then
// copied as they are (sealed again for their new place), a round at a
// time while commits go on, and the last few with the file held
// exclusively, before the rename.
//
// Once the new file is in place, Rewrite calls swap, which must call move
// exactly once with its own locks held (those Append is called under):
// move switches the log to the new file and returns by how much every
// offset at or past from has moved: those of the copied batches and those
// Append returned for the batch being filled. A failed directory sync
// after the rename is returned, and stops writes: the rename may not
// survive a power cut.
func (l *Log) Rewrite(ctx context.Context, fill func(r Reader, w *Writer) (from int64, err error), swap func(move func() int64)) error {
	if !CanRewrite {
		return errors.ErrUnsupported
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.rewriteMu.Lock()
	defer l.rewriteMu.Unlock()
	l.fileMu.RLock()
	shared, unlocked := true, false
	defer func() {
		switch {
		case unlocked:
		case shared:
			l.fileMu.RUnlock()
		default:
			l.fileMu.Unlock()
		}
	}()
	if err := l.Writable(); err != nil {
		return err
	}

	tmp := l.path + RewriteSuffix
	// The new file becomes the journal: it needs the same flags.
	nf, err := openLocked(l.fs, tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return err
	}
	// The rewrite's own writes go through a second descriptor without
	// the sync flag, and the file is synced once they are done: a
	// synchronous write of every few MiB would queue each commit's sync
	// behind it (a Begin waited 66 ms for one at a million entries).
	bulk, err := l.fs.OpenFile(tmp, os.O_WRONLY, 0, false)
	if err != nil {
		_ = nf.Close()
		_ = l.fs.Remove(tmp)
		return err
	}
	defer bulk.Close()
	fail := func(err error) error {
		_ = nf.Close()
		_ = l.fs.Remove(tmp)
		return err
	}
	salt, err := random64(l.opts.Rand)
	if err != nil {
		return fail(err)
	}
	w := &Writer{f: bulk, salt: salt, batchStart: -1}
	// The buffer holds a batch of the new file at a time; a small log's
	// whole new file fits in far less (the old file is its bound, but for
	// the batches copied meanwhile, which append grows it for).
	w.buf = append(make([]byte, 0, min(rewriteBatch, l.size.Load())+64<<10), FileHeader(salt)...)
	from, err := fill(Reader{l}, w)
	if err != nil {
		return fail(err)
	}
	if err := w.flush(); err != nil {
		return fail(err)
	}
	tailStart := w.off
	if err := l.step("catchup"); err != nil {
		return fail(err)
	}
	// Catch up with the commits made meanwhile, without holding them up,
	// until what is left is small.
	copied := from
	for round := 0; round < 8; round++ {
		end := l.size.Load()
		if round > 0 && end-copied < rewriteBatch {
			break
		}
		if copied, err = l.copyBatches(w, copied, end); err != nil {
			return fail(err)
		}
	}
	if err := datasync(nf); err != nil {
		return fail(err)
	}

	// The rest with the file held: no batch is in flight from here.
	l.fileMu.RUnlock()
	l.fileMu.Lock()
	shared = false
	if err := l.Writable(); err != nil {
		return fail(err)
	}
	if _, err = l.copyBatches(w, copied, l.size.Load()); err != nil {
		return fail(err)
	}
	// The new file's preallocated tail, synced with it: the commits
	// after the switch write into it, as before.
	tail := tailFor(w.off)
	if _, err := bulk.WriteAt(make([]byte, tail), w.off); err != nil {
		return fail(err)
	}
	if err := datasync(nf); err != nil {
		return fail(err)
	}
	nfi, err := nf.Stat()
	if err != nil {
		return fail(err)
	}
	if err := l.fs.Rename(tmp, l.path); err != nil {
		return fail(err)
	}
	// From here the new file is the journal: switch to it even if the
	// directory sync fails, and report that.
	dirErr := l.step("syncdir")
	if dirErr == nil {
		dirErr = syncDir(l.fs, l.path)
	}

	delta := tailStart - from
	var old File
	moved := false
	move := func() int64 {
		moved = true
		l.mu.Lock()
		defer l.mu.Unlock()
		old = l.f
		l.f, l.fi = nf, nfi
		l.cur.off += delta
		l.seq, l.salt = w.seq, salt
		l.size.Store(w.off)
		l.alloc = w.off + tail
		l.skipped = 0 // the damage Salvage skipped is not in the new file
		l.marked = false
		l.rewrites.Add(1)
		if dirErr != nil && l.broken == nil {
			l.broken = fmt.Errorf("journal writes stopped: sync the directory after a rewrite: %w", dirErr)
		}
		return delta
	}
	swap(move)
	if !moved {
		move()
	}
	// Closing the old file frees it, since the rename unlinked it: for a
	// large journal, tens of milliseconds in the kernel (91 ms for a
	// 1.2 GB file on a small VM), and a slow journal commit for the file
	// system. Writers need not wait for the first, and freeReplaced
	// spreads the second.
	l.fileMu.Unlock()
	unlocked = true
	if dirErr != nil {
		// The rename may not survive a power cut, and then the old file
		// is the journal again: leave it whole. A plain close frees it
		// only once the unlink is durable (found by the simulator,
		// internal/sim's TestFoundFreedBeforeTheRenameIsDurable).
		_ = old.Close()
		return fmt.Errorf("sync the directory after a rewrite: %w", dirErr)
	}
	old.CloseReplaced() // and releases the old inode's lock; nf holds the new one's
	return nil
}

// copyBatches appends the old file's batches from off to end (durable,
// so whole and valid) to w, each sealed again for its place in the new
// file, and returns end. The file must be held, shared or exclusively.
func (l *Log) copyBatches(w *Writer, off, end int64) (int64, error) {
	l.mu.Lock()
	salt := l.salt
	l.mu.Unlock()
	rd := &batchReader{r: l.f, size: end, salt: salt}
	for off < end {
		_, records, n, ok, err := rd.batchAt(off)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("%w: committed batch at offset %d does not read back", ErrCorrupt, off)
		}
		start := len(w.buf)
		w.buf = append(w.buf, make([]byte, BatchHeaderLen)...)
		w.buf = append(w.buf, records...)
		w.seq++
		SealBatch(w.buf[start:], w.seq, w.off+int64(start), w.salt)
		if len(w.buf) >= rewriteBatch {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
		off += int64(n)
	}
	return end, w.flush()
}
