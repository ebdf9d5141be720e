package simdisk

import (
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idemhttp/internal/wal"
)

// ErrHalted is what every call gets once the power is cut (see
// [Disk.HaltAt], [Disk.Halt]) and until [Disk.Crash], and what every
// call on a file opened before a Crash or a [Disk.Kill] gets: the
// process that opened it is dead. The call did not happen, except that
// the write the power cut may have reached the cache in part.
var ErrHalted = errors.New("simdisk: the power is cut")

// Torn says what a crash keeps of a file's unsynced writes.
type Torn int

const (
	// TornNone: a crash keeps exactly what the file's last sync made
	// durable.
	TornNone Torn = iota

	// TornSector: a crash also keeps, of each file, a prefix (of random
	// length) of its unsynced writes and truncations, in the order they
	// were made, the last write kept cut at a sector boundary of the
	// file ([Options.SectorSize]): a disk that writes sectors in order
	// and loses its cache.
	TornSector

	// TornByte is TornSector with the last write cut at any byte.
	TornByte
)

// Options configures a [Disk]. The zero value is a strict disk: a crash
// keeps exactly what was synced, and each write through a file opened
// with dsync is durable when it returns.
type Options struct {
	// Torn says what a crash keeps of the unsynced writes.
	Torn Torn

	// SectorSize is the sector for TornSector; zero means 512.
	SectorSize int

	// DirPrefix makes a crash keep also a prefix (of random length) of
	// the directory changes made since the last directory syncs, in the
	// order they were made, across directories, as a file system with an
	// ordered metadata journal may. Without it a crash keeps exactly what
	// each directory's last sync made durable.
	DirPrefix bool

	// NoDSync makes the disk ignore dsync, as the OS does off Linux:
	// [wal.File.WriteSyncs] is false, and the log syncs after each write.
	NoDSync bool
}

// Disk is a simulated disk: a [wal.FS] held in memory, in which a write
// reaches a cache and only a sync makes it durable, a directory's entries
// are durable only once the directory is synced, and a crash drops what
// is not durable ([Disk.Crash]). Its calls can fail by a [Fault]. It is
// deterministic: no clock, no goroutine, no dependence on map order, so
// the same calls with the same random source give the same state.
//
// Paths are cleaned and compared as strings: there are no symlinks, no
// permissions checks beyond a file's open mode, and every directory
// exists. Create one with [New]; it is safe for concurrent use.
type Disk struct {
	mu   sync.Mutex
	opts Options

	live    map[string]*node // what each path names now
	durable map[string]*node // what it names after a crash
	dirOps  []dirOp          // directory changes not yet synced, oldest first
	nextID  uint64

	epoch       uint64 // bumped by Crash and Kill: older files are dead
	ignoreSyncs bool
	fault       Fault
	seq         int // calls since New
	mutations   int // mutating calls since New, Crash or Kill
	haltAt      int
	halted      bool
	inflight    *inflight // the write the power cut, if any
	dirSyncs    map[string]int
}

var _ wal.FS = (*Disk)(nil)

// New returns an empty disk; opts nil means the zero Options.
func New(opts *Options) *Disk {
	d := &Disk{live: map[string]*node{}, durable: map[string]*node{}, dirSyncs: map[string]int{}}
	if opts != nil {
		d.opts = *opts
	}
	if d.opts.SectorSize <= 0 {
		d.opts.SectorSize = 512
	}
	return d
}

// node is a file's contents.
type node struct {
	id      uint64
	data    []byte   // what reads see: durable with every change since applied
	durable []byte   // what a crash keeps at least
	pending []change // the changes since the last sync, oldest first
	mode    os.FileMode
	locked  bool // a writer's lock is held
	viewers int  // read-only opens' shared locks held
}

// change is an unsynced write, or a truncation (trunc, to size off).
type change struct {
	off   int64
	data  []byte
	trunc bool
}

// inflight is the write a power cut interrupted.
type inflight struct {
	n *node
	c change
}

// dirOp is one directory change: the paths of one directory it sets
// (n nil: removes), applied together (a rename within a directory is
// atomic).
type dirOp struct {
	dir     string
	entries []entry
}

type entry struct {
	path string
	n    *node
}

// apply returns b with c applied; b is owned.
func apply(b []byte, c change) []byte {
	if c.trunc {
		if int64(len(b)) >= c.off {
			return b[:c.off]
		}
		return append(b, make([]byte, int(c.off)-len(b))...)
	}
	if end := int(c.off) + len(c.data); end > len(b) {
		b = append(b, make([]byte, end-len(b))...)
	}
	copy(b[c.off:], c.data)
	return b
}

// syncNode makes n's pending changes durable.
func (n *node) sync() {
	for _, c := range n.pending {
		n.durable = apply(n.durable, c)
	}
	n.pending = nil
}

// change applies c to n's cache, unsynced.
func (n *node) change(c change) {
	n.data = apply(n.data, c)
	n.pending = append(n.pending, c)
}

// begin starts a call: it counts it, and returns ErrHalted if the power
// is cut or is cut now (cut: at this call), or the Fault's error.
func (d *Disk) begin(op Op, mutates bool) (cut bool, err error) {
	d.seq++
	op.Seq = d.seq
	if d.halted {
		return false, ErrHalted
	}
	if mutates {
		d.mutations++
		if d.mutations == d.haltAt {
			d.halted = true
			return true, ErrHalted
		}
	}
	if d.fault != nil {
		if err := d.fault(op); err != nil {
			if errors.Is(err, ErrHalted) {
				d.halted = true
				return true, ErrHalted
			}
			return false, err
		}
	}
	return false, nil
}

func pathErr(op, path string, err error) error {
	return &fs.PathError{Op: op, Path: path, Err: err}
}

// OpenFile opens name, creating it (mode perm) with os.O_CREATE:
// a directory change, durable once its directory is synced. os.O_TRUNC
// is a change to the file's data, durable once the file is synced. A
// file opened with dsync, unless [Options.NoDSync], makes each write
// durable before it returns, as a sync does.
func (d *Disk) OpenFile(name string, flag int, perm os.FileMode, dsync bool) (wal.File, error) {
	name = filepath.Clean(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.live[name]
	mutates := n == nil && flag&os.O_CREATE != 0 || n != nil && flag&os.O_TRUNC != 0
	if _, err := d.begin(Op{Kind: OpOpen, Path: name, Flag: flag}, mutates); err != nil {
		return nil, pathErr("open", name, err)
	}
	access := flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
	f := &file{d: d, name: name, epoch: d.epoch, read: access != os.O_WRONLY, write: access != os.O_RDONLY}
	switch {
	case n == nil && flag&os.O_CREATE == 0:
		return nil, pathErr("open", name, fs.ErrNotExist)
	case n != nil && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, pathErr("open", name, fs.ErrExist)
	case n == nil:
		d.nextID++
		n = &node{id: d.nextID, mode: perm.Perm()}
		d.live[name] = n
		d.dirOps = append(d.dirOps, dirOp{dir: filepath.Dir(name), entries: []entry{{name, n}}})
	case flag&os.O_TRUNC != 0 && f.write:
		n.change(change{trunc: true})
	}
	f.n = n
	f.dsync = dsync && !d.opts.NoDSync
	return f, nil
}

// Stat describes what name names now.
func (d *Disk) Stat(name string) (os.FileInfo, error) {
	name = filepath.Clean(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.begin(Op{Kind: OpStat, Path: name}, false); err != nil {
		return nil, pathErr("stat", name, err)
	}
	n := d.live[name]
	if n == nil {
		return nil, pathErr("stat", name, fs.ErrNotExist)
	}
	return n.info(name), nil
}

// SameFile reports whether a and b, from this disk's Stat calls,
// describe one file.
func (d *Disk) SameFile(a, b os.FileInfo) bool {
	x, ok1 := a.(*fileInfo)
	y, ok2 := b.(*fileInfo)
	return ok1 && ok2 && x.id == y.id
}

// Rename makes newpath name what oldpath names, and oldpath nothing: one
// change of each directory involved, durable once it is synced (within
// one directory, atomic). Open files keep their contents.
func (d *Disk) Rename(oldpath, newpath string) error {
	oldpath, newpath = filepath.Clean(oldpath), filepath.Clean(newpath)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.begin(Op{Kind: OpRename, Path: oldpath, NewPath: newpath}, true); err != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	n := d.live[oldpath]
	if n == nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrNotExist}
	}
	if oldpath == newpath {
		return nil
	}
	d.live[newpath] = n
	delete(d.live, oldpath)
	if od, nd := filepath.Dir(oldpath), filepath.Dir(newpath); od == nd {
		d.dirOps = append(d.dirOps, dirOp{dir: od, entries: []entry{{newpath, n}, {oldpath, nil}}})
	} else {
		d.dirOps = append(d.dirOps, dirOp{dir: nd, entries: []entry{{newpath, n}}}, dirOp{dir: od, entries: []entry{{oldpath, nil}}})
	}
	return nil
}

// Remove removes name: a directory change, durable once its directory
// is synced. Open files keep their contents.
func (d *Disk) Remove(name string) error {
	name = filepath.Clean(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.begin(Op{Kind: OpRemove, Path: name}, true); err != nil {
		return pathErr("remove", name, err)
	}
	if d.live[name] == nil {
		return pathErr("remove", name, fs.ErrNotExist)
	}
	delete(d.live, name)
	d.dirOps = append(d.dirOps, dirOp{dir: filepath.Dir(name), entries: []entry{{name, nil}}})
	return nil
}

// SyncDir makes every change of directory dir durable, and counts the
// sync (see [Disk.DirSyncs]); with syncs ignored, it only counts.
func (d *Disk) SyncDir(dir string) error {
	dir = filepath.Clean(dir)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.begin(Op{Kind: OpSyncDir, Path: dir}, true); err != nil {
		return pathErr("sync", dir, err)
	}
	d.dirSyncs[dir]++
	if d.ignoreSyncs {
		return nil
	}
	kept := d.dirOps[:0]
	for _, op := range d.dirOps {
		if op.dir != dir {
			kept = append(kept, op)
			continue
		}
		for _, e := range op.entries {
			setEntry(d.durable, e)
		}
	}
	clear(d.dirOps[len(kept):])
	d.dirOps = kept
	return nil
}

func setEntry(m map[string]*node, e entry) {
	if e.n == nil {
		delete(m, e.path)
	} else {
		m[e.path] = e.n
	}
}

// EvalSymlinks returns name cleaned, if it exists: the disk has no
// symlinks.
func (d *Disk) EvalSymlinks(name string) (string, error) {
	name = filepath.Clean(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.live[name] == nil {
		return "", pathErr("lstat", name, fs.ErrNotExist)
	}
	return name, nil
}

// SetFault sets the Fault that decides, before each call, whether it
// fails; nil for none.
func (d *Disk) SetFault(f Fault) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fault = f
}

// SetIgnoreSyncs makes every sync (SyncData, a dsync write's, SyncDir)
// return success without making anything durable, as the
// idemhttp_nosync control build does: for a test to show that its check
// bites.
func (d *Disk) SetIgnoreSyncs(ignore bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ignoreSyncs = ignore
}

// HaltAt cuts the power at the nth mutating call from now on (1: the
// next; 0 cancels): a write, a sync, a truncation, a rename, a removal, a
// directory sync, or an open that creates or truncates. That call and
// every later one fail with [ErrHalted] until [Disk.Crash]; a write cut
// may have reached the cache in part (a torn write, see [Torn]).
func (d *Disk) HaltAt(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.haltAt = 0
	if n > 0 {
		d.haltAt = d.mutations + n
	}
}

// Halt cuts the power now: every later call fails with [ErrHalted]
// until [Disk.Crash] or [Disk.Kill].
func (d *Disk) Halt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.halted = true
}

// Halted reports whether the power is cut.
func (d *Disk) Halted() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.halted
}

// Mutations is the number of mutating calls (see [Disk.HaltAt]) since
// New, or the last Crash or Kill.
func (d *Disk) Mutations() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mutations
}

// DirSyncs is the number of successful SyncDir calls of directory dir
// since New, syncs ignored included.
func (d *Disk) DirSyncs(dir string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dirSyncs[filepath.Clean(dir)]
}

// Crash is a power cut and a reboot: it keeps what is durable, and of
// the rest what [Options] allow, drawing from rng which prefix of each
// file's unsynced changes and of the directory changes survives (a nil
// rng keeps nothing unsynced, whatever the Options). Files are visited
// in path order, so one rng gives one outcome. Nothing durable is lost or reordered. Every
// open file dies: its calls fail with [ErrHalted], its locks are
// released. The power is back on.
func (d *Disk) Crash(rng *rand.Rand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inflight != nil {
		d.inflight.n.pending = append(d.inflight.n.pending, d.inflight.c)
	}
	keep := 0
	if d.opts.DirPrefix && len(d.dirOps) > 0 && rng != nil {
		keep = rng.IntN(len(d.dirOps) + 1)
	}
	for _, op := range d.dirOps[:keep] {
		for _, e := range op.entries {
			setEntry(d.durable, e)
		}
	}
	d.dirOps = nil
	d.live = make(map[string]*node, len(d.durable))
	paths := make([]string, 0, len(d.durable))
	for p, n := range d.durable {
		d.live[p] = n
		paths = append(paths, p)
	}
	slices.Sort(paths)
	seen := map[*node]bool{}
	for _, p := range paths {
		n := d.durable[p]
		if seen[n] {
			continue
		}
		seen[n] = true
		d.tear(n, rng)
	}
	d.restart()
}

// tear makes n what a crash leaves of it: durable, and a prefix of its
// pending changes under TornSector and TornByte.
func (d *Disk) tear(n *node, rng *rand.Rand) {
	if d.opts.Torn != TornNone && len(n.pending) > 0 && rng != nil {
		k := rng.IntN(len(n.pending) + 1)
		for _, c := range n.pending[:k] {
			n.durable = apply(n.durable, c)
		}
		if k < len(n.pending) && !n.pending[k].trunc {
			c := n.pending[k]
			c.data = c.data[:d.cut(c, rng)]
			n.durable = apply(n.durable, c)
		}
	}
	n.pending = nil
	n.data = slices.Clone(n.durable)
}

// cut is how many bytes of write c a crash keeps, at a sector boundary
// of the file under TornSector.
func (d *Disk) cut(c change, rng *rand.Rand) int {
	if d.opts.Torn == TornByte {
		return rng.IntN(len(c.data) + 1)
	}
	s := int64(d.opts.SectorSize)
	end := c.off + int64(len(c.data))
	first := (c.off/s + 1) * s // the first boundary past the start
	var bounds []int
	bounds = append(bounds, 0)
	for b := first; b < end; b += s {
		bounds = append(bounds, int(b-c.off))
	}
	return bounds[rng.IntN(len(bounds))]
}

// Kill is the death of every process using the disk, the machine
// staying up: open files die (see [ErrHalted]) and their locks are
// released, the cache stays, and a write the power cut (after HaltAt)
// is undone. The power is back on.
func (d *Disk) Kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.restart()
}

// restart forgets the processes: files, locks, the halt.
func (d *Disk) restart() {
	d.epoch++
	d.inflight = nil
	d.halted = false
	d.haltAt = 0
	d.mutations = 0
	for _, n := range d.live {
		n.locked, n.viewers = false, 0
	}
	for _, n := range d.durable {
		n.locked, n.viewers = false, 0
	}
}

// Clone returns a copy of the disk as it is, sharing nothing with it: its
// files, durable state, unsynced changes, a cut power and the write it
// cut, its counters and options, but no Fault and no open file (locks
// are released, as after [Disk.Kill], but the power stays as it is). A
// test halts a run once and crashes clones of it in several ways.
func (d *Disk) Clone() *Disk {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := &Disk{
		opts: d.opts, nextID: d.nextID, epoch: d.epoch + 1, ignoreSyncs: d.ignoreSyncs,
		seq: d.seq, mutations: d.mutations, haltAt: d.haltAt, halted: d.halted,
		live: make(map[string]*node, len(d.live)), durable: make(map[string]*node, len(d.durable)),
		dirSyncs: make(map[string]int, len(d.dirSyncs)),
	}
	nodes := map[*node]*node{}
	cp := func(n *node) *node {
		if n == nil {
			return nil
		}
		if m, ok := nodes[n]; ok {
			return m
		}
		m := &node{id: n.id, data: slices.Clone(n.data), durable: slices.Clone(n.durable), mode: n.mode}
		for _, ch := range n.pending {
			ch.data = slices.Clone(ch.data)
			m.pending = append(m.pending, ch)
		}
		nodes[n] = m
		return m
	}
	for p, n := range d.live {
		c.live[p] = cp(n)
	}
	for p, n := range d.durable {
		c.durable[p] = cp(n)
	}
	for _, op := range d.dirOps {
		o := dirOp{dir: op.dir}
		for _, e := range op.entries {
			o.entries = append(o.entries, entry{e.path, cp(e.n)})
		}
		c.dirOps = append(c.dirOps, o)
	}
	if d.inflight != nil {
		ch := d.inflight.c
		ch.data = slices.Clone(ch.data)
		c.inflight = &inflight{n: cp(d.inflight.n), c: ch}
	}
	for k, v := range d.dirSyncs {
		c.dirSyncs[k] = v
	}
	return c
}

// ReadFile returns what name holds now, as a read would see it. It is
// not a call of the disk's (no Fault, no count), and works with the power
// cut.
func (d *Disk) ReadFile(name string) ([]byte, error) {
	name = filepath.Clean(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.live[name]
	if n == nil {
		return nil, pathErr("open", name, fs.ErrNotExist)
	}
	return slices.Clone(n.data), nil
}

// WriteFile makes name hold data with mode perm, durably (its entry and
// its contents), as if written and synced long ago: for a test to set
// up a disk. It is not a call of the disk's.
func (d *Disk) WriteFile(name string, data []byte, perm os.FileMode) {
	name = filepath.Clean(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	n := &node{id: d.nextID, data: slices.Clone(data), durable: slices.Clone(data), mode: perm.Perm()}
	d.live[name] = n
	d.durable[name] = n
}

// Names returns the paths that name a file now, sorted.
func (d *Disk) Names() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(d.live))
	for p := range d.live {
		names = append(names, p)
	}
	slices.Sort(names)
	return names
}

// fileInfo is a Stat's answer.
type fileInfo struct {
	name string
	id   uint64
	size int64
	mode os.FileMode
}

func (n *node) info(path string) *fileInfo {
	return &fileInfo{name: filepath.Base(path), id: n.id, size: int64(len(n.data)), mode: n.mode}
}

func (fi *fileInfo) Name() string       { return fi.name }
func (fi *fileInfo) Size() int64        { return fi.size }
func (fi *fileInfo) Mode() os.FileMode  { return fi.mode }
func (fi *fileInfo) ModTime() time.Time { return time.Time{} } // no clock
func (fi *fileInfo) IsDir() bool        { return false }
func (fi *fileInfo) Sys() any           { return nil }

// file is an open file of a Disk.
type file struct {
	d           *Disk
	n           *node
	name        string
	epoch       uint64
	read, write bool
	dsync       bool
	closed      bool
	locked      bool // holds n's writer's lock
	viewer      bool // holds a viewer's lock
}

var _ wal.File = (*file)(nil)

// start begins a call on f: ErrHalted when f's process is dead.
func (f *file) start(op Op, mutates bool) (cut bool, err error) {
	if f.closed {
		return false, fs.ErrClosed
	}
	if f.epoch != f.d.epoch {
		return false, ErrHalted
	}
	op.Path = f.name
	return f.d.begin(op, mutates)
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if _, err := f.start(Op{Kind: OpRead, Off: off, Len: len(p)}, false); err != nil {
		return 0, pathErr("read", f.name, err)
	}
	if !f.read {
		return 0, pathErr("read", f.name, syscall.EBADF)
	}
	if off < 0 {
		return 0, pathErr("read", f.name, fs.ErrInvalid)
	}
	if len(p) == 0 {
		return 0, nil // as os.File: no read, no EOF
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.n.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p at off into the cache. Through a dsync file, it then
// syncs the file, as SyncData does, and fails as a failed SyncData would.
func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	c := change{off: off, data: slices.Clone(p)}
	if cut, err := f.start(Op{Kind: OpWrite, Off: off, Len: len(p)}, true); err != nil {
		if cut && f.write {
			f.d.inflight = &inflight{n: f.n, c: c}
		}
		return 0, pathErr("write", f.name, err)
	}
	if !f.write {
		return 0, pathErr("write", f.name, syscall.EBADF)
	}
	if off < 0 {
		return 0, pathErr("write", f.name, fs.ErrInvalid)
	}
	f.n.change(c)
	if f.dsync {
		// The sync half of the same call: a fault can fail it, but the
		// power cut counts the call once.
		if err := f.syncLocked(Op{Kind: OpSync, Off: off, Len: len(p)}, false); err != nil {
			return 0, pathErr("write", f.name, err)
		}
	}
	return len(p), nil
}

// syncLocked is a sync of f's file. A failed one drops what it would
// have made durable: it stays in the cache, but no later sync makes it
// durable (as Linux marks the pages clean after an I/O error).
func (f *file) syncLocked(op Op, mutates bool) error {
	op.Path = f.name
	if _, err := f.d.begin(op, mutates); err != nil {
		if !errors.Is(err, ErrHalted) {
			f.n.pending = nil
		}
		return err
	}
	if !f.d.ignoreSyncs {
		f.n.sync()
	}
	return nil
}

func (f *file) SyncData() error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if f.closed {
		return pathErr("sync", f.name, fs.ErrClosed)
	}
	if f.epoch != f.d.epoch {
		return pathErr("sync", f.name, ErrHalted)
	}
	if err := f.syncLocked(Op{Kind: OpSync}, true); err != nil {
		return pathErr("sync", f.name, err)
	}
	return nil
}

func (f *file) Close() error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, fs.ErrClosed)
	}
	f.closed = true
	if f.epoch != f.d.epoch {
		return nil // its process is dead; its locks went with it
	}
	if f.locked {
		f.n.locked = false
	}
	if f.viewer {
		f.n.viewers--
	}
	return nil
}

func (f *file) Stat() (os.FileInfo, error) {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if _, err := f.start(Op{Kind: OpStat}, false); err != nil {
		return nil, pathErr("stat", f.name, err)
	}
	return f.n.info(f.name), nil
}

func (f *file) Truncate(size int64) error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if _, err := f.start(Op{Kind: OpTruncate, Off: size}, true); err != nil {
		return pathErr("truncate", f.name, err)
	}
	if !f.write {
		return pathErr("truncate", f.name, syscall.EBADF)
	}
	if size < 0 {
		return pathErr("truncate", f.name, fs.ErrInvalid)
	}
	f.n.change(change{off: size, trunc: true})
	return nil
}

// Chmod changes the mode, durably at once (modes are not what the disk
// simulates).
func (f *file) Chmod(mode os.FileMode) error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if _, err := f.start(Op{Kind: OpChmod}, false); err != nil {
		return pathErr("chmod", f.name, err)
	}
	f.n.mode = mode.Perm()
	return nil
}

func (f *file) WriteSyncs() bool { return f.dsync }

// WriteBack does nothing: the disk has no write-back to hint.
func (f *file) WriteBack(off, n int64) error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if _, err := f.start(Op{Kind: OpWriteBack, Off: off, Len: int(n)}, false); err != nil {
		return pathErr("writeback", f.name, err)
	}
	return nil
}

func (f *file) Lock() error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if _, err := f.start(Op{Kind: OpLock}, false); err != nil {
		return pathErr("lock", f.name, err)
	}
	if f.locked {
		return nil
	}
	if f.n.locked {
		return wal.ErrLocked
	}
	f.n.locked, f.locked = true, true
	return nil
}

func (f *file) LockViewer() error {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if _, err := f.start(Op{Kind: OpLock}, false); err != nil {
		return pathErr("lock", f.name, err)
	}
	if !f.viewer {
		f.n.viewers++
		f.viewer = true
	}
	return nil
}

// CloseReplaced truncates the file to nothing when no viewer holds it
// (unsynced, as the OS's paced truncation is: a crash may keep it), then
// closes it.
func (f *file) CloseReplaced() {
	f.d.mu.Lock()
	if !f.closed && f.epoch == f.d.epoch && f.n.viewers == 0 && f.write {
		if _, err := f.start(Op{Kind: OpTruncate}, true); err == nil {
			f.n.change(change{trunc: true})
		}
	}
	f.d.mu.Unlock()
	_ = f.Close()
}
