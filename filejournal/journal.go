package filejournal

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/wal"
)

// Options configures [Open]. A nil *Options and
// the zero value both mean the defaults: bodies stored, the standard
// credentials withheld, damage refused, opened for writing, done entries
// pruned after the retention its Client declares (see [Journal.Retain]).
type Options struct {
	// OmitBodies keeps request bodies out of the file; fingerprints are
	// still stored. Use it when bodies hold data that must not rest on
	// disk. An entry without its body cannot be resent by Resume: it can
	// only be reported.
	OmitBodies bool

	// SecretHeaders names request headers never written to the file, in
	// any letter case, beyond those [idemhttp.Entry.Sanitized] always
	// withholds (Authorization, Cookie, API keys under their common
	// names): for entries given to Begin directly, by a program that
	// loads a batch. A Client drops its own [idemhttp.Client.SecretHeaders]
	// before Begin.
	SecretHeaders []string

	// SkipVerify opens a damaged journal instead of refusing it, for
	// inspection and repair: damaged batches in the middle of the file are
	// skipped, with the entries they held, and records that refer to
	// skipped entries are ignored. [Journal.Verify] still reports the
	// damage; [Journal.Compact] rewrites the file without it. Entries
	// lost this way may be operations whose outcome is unknown, so a
	// repaired journal needs a person's review.
	SkipVerify bool

	// ReadOnly opens an existing journal for inspection: without the
	// writer's lock, so also while another process writes it, and on a
	// read-only mount. Nothing in the file changes (no mode change, no
	// repair of a torn tail, no compaction, no pruning); the journal shows
	// the file as it was when opened. Calls that write return an error
	// wrapping [ErrReadOnly].
	ReadOnly bool

	// KeepDone is how long the journal keeps a done entry after its
	// outcome, so that a rerun of its operation sends nothing (a
	// *idemhttp.DoneError, or the kept result). Zero means the retention
	// its Client tells it (idemhttp.Policy.Retention: the server's key
	// retention), and it is never shorter than that. After it, the journal
	// has forgotten the operation, as the server its key, and a rerun runs
	// it as a new one: set it longer for a batch whose reruns may come
	// later (a day's outage, a job rerun next week), at the cost of the
	// index's memory for those entries.
	KeepDone time.Duration

	// PruneInterval is how often the journal prunes, by itself and in the
	// background, the done entries older than its retention (see
	// [Journal.Retain]), so that a process that never restarts stays
	// bounded. Zero means one hour; negative turns the pruning off.
	PruneInterval time.Duration

	// The fields below are test seams: a program has no reason to set
	// them.

	// FS is the file system the journal's files live on: the journal
	// itself, its index file, a torn tail kept aside and a compaction's
	// new file. Every file access of the journal goes through it. nil
	// means the operating system's. A test that injects faults (a failed
	// sync, a full disk, a torn write) implements [FS] and [File], whose
	// docs list the methods and what each must do.
	FS FS

	// Clock replaces time.Now as the journal's clock ([Journal.Now]):
	// the time it stamps on entries and outcomes, and by which a
	// [idemhttp.Client] ages them; also the time in a torn tail's file
	// name. nil means time.Now. For tests that set the clock forward and
	// back.
	Clock func() time.Time

	// Uptime replaces the machine's uptime clock, the evidence by which
	// the journal measures a clock set back (see [Journal.Now]): it
	// returns a name of the current boot and the time since it, and ""
	// when it has none (a test that wants no evidence returns that). nil
	// means, on Linux, the kernel's boot id and CLOCK_BOOTTIME (which
	// counts suspended time and cannot be set), evidence that outlives
	// the process until the machine restarts; elsewhere, and when Clock
	// is set, the process's own monotonic clock (a synctest bubble's
	// time, in a bubble), evidence for as long as the process runs.
	Uptime func() (boot string, since time.Duration)

	// Rand is the source of the random salt of the journal file and of
	// every compaction's new file, and of the nonce of every close
	// marker (see docs/journal-format.md); nil means crypto/rand. Set it
	// only where a file's bytes must be the same on every run (the
	// simulator; with Clock, and Uptime or a synctest bubble, since the
	// clock's witness records hold readings of both): anyone who can
	// predict a file's salt can craft a request body that passes for a
	// batch of the file when an open searches past damage.
	Rand io.Reader

	// writeBehind, for tests, is how long a Finish's record may wait for
	// company (wal.Options.LazyDelay); zero means [WriteBehind].
	writeBehind time.Duration
}

// FS is the file system under a [Journal] (see [Options.FS]). It is
// declared by the journal's internal log package, hence the alias; these
// are its methods, each doing what the function of package os it names
// does, with errors of package os or wrapping them:
//
//	OpenFile(name string, flag int, perm os.FileMode, dsync bool) (File, error)
//	    // os.OpenFile, flag made of os.O_RDONLY, O_WRONLY, O_RDWR,
//	    // O_CREATE, O_EXCL and O_TRUNC; with dsync, every write through
//	    // the file is asked to be durable when it returns (O_DSYNC), and
//	    // File.WriteSyncs says whether it is
//	Stat(name string) (os.FileInfo, error)     // os.Stat, following symlinks
//	SameFile(a, b os.FileInfo) bool             // os.SameFile, for this FS's Stat and File.Stat
//	Rename(oldpath, newpath string) error      // os.Rename: atomic, durable once the directory is synced
//	Remove(name string) error                  // os.Remove
//	SyncDir(dir string) error                  // makes dir's entries (created, renamed, removed) durable
//	EvalSymlinks(name string) (string, error)  // filepath.EvalSymlinks
type FS = wal.FS

// File is an open file of an [FS]. The journal reads and writes it at
// offsets only; reads may run concurrently with each other and with one
// writer. Its methods:
//
//	ReadAt(p []byte, off int64) (int, error)   // as os.File's
//	WriteAt(p []byte, off int64) (int, error)  // as os.File's
//	Close() error                              // closes the file, releasing its locks
//	Stat() (os.FileInfo, error)                // its size and mode, and for FS.SameFile
//	Truncate(size int64) error                 // as os.File's
//	Chmod(mode os.FileMode) error              // as os.File's
//	SyncData() error
//	    // makes the data, and the size needed to read it back, durable
//	    // (fdatasync); after a failed SyncData nothing written since the
//	    // last successful one may be taken as durable, even if a later
//	    // SyncData succeeds
//	WriteSyncs() bool
//	    // whether each WriteAt is durable when it returns (opened with
//	    // dsync, and the FS offers it), so that no SyncData follows it
//	WriteBack(off, n int64) error
//	    // a hint: writes the n bytes at off out to the disk without making
//	    // anything durable, so that a later SyncData has little left to do;
//	    // it may do nothing
//	Lock() error
//	    // takes the writer's exclusive lock without waiting: ErrLocked
//	    // if another open file holds it; it lasts until Close, or until
//	    // the process dies
//	LockViewer() error
//	    // takes a read-only open's shared lock, which makes a writer that
//	    // replaced the file leave it whole; ErrLocked means a writer is
//	    // freeing the file (it was replaced); an FS without such locks
//	    // returns nil
//	CloseReplaced()
//	    // closes a file a rename replaced, first freeing its blocks a
//	    // step at a time when no read-only open still reads it (best
//	    // effort, no error)
type File = wal.File

// WriteBehind bounds how long a [Journal] keeps an outcome
// recorded by Finish only in memory when no other write comes to carry it
// to disk: 20 ms (see Journal's Durability).
const WriteBehind = wal.DefaultLazyDelay

// defaultRetention is how long a Journal keeps done entries until a
// Client tells it its Policy.Retention: 24 hours, like the default policy's
// and Stripe's key retention.
const defaultRetention = 24 * time.Hour

// Stats counts a [Journal]'s work since it was opened.
type Stats struct {
	// Writes is the number of records appended: one per Begin that stored
	// an entry, per Finish, and per entry deleted.
	Writes uint64

	// Commits is the number of group commits: each one synchronous write
	// (O_DSYNC on Linux; a write and an fdatasync elsewhere). Commits
	// divided by Writes falls below one when group commit merges
	// concurrent writes.
	Commits uint64

	// Compactions is the number of times the file was rewritten with only
	// its live entries.
	Compactions uint64

	// TruncatedBytes is the size of the tail that [Open] cut
	// off because it ends in an incomplete or damaged batch with nothing
	// valid after it: normally a group commit that a crash interrupted
	// before any caller was told it succeeded. The bytes are kept in
	// TornFile. With ReadOnly, the tail is only ignored.
	TruncatedBytes int64

	// TornFile is the file, beside the journal, that holds the tail cut
	// off when it was opened; "" if none.
	TornFile string

	// CleanClose reports whether the journal had been closed cleanly
	// before it was opened. After a clean close nothing can be torn, so a
	// damaged end of the file is reported as corruption.
	CleanClose bool

	// IndexLoaded reports whether the open read the index from the index
	// file that the last clean close or compaction wrote beside the
	// journal (see [Journal]), replaying only what was written after
	// it, instead of rebuilding it from the whole file.
	IndexLoaded bool

	// SkippedBytes is the size of the damaged batches that
	// [Options.SkipVerify] skipped when the file was opened, until
	// [Journal.Compact] rewrites the file without them (then 0).
	SkippedBytes int64

	// FileBytes is the size of the file's durable part. LiveBytes
	// estimates the size it would have if compacted now, erring high: it
	// counts entryOverhead bytes per entry where the file spends a few
	// dozen.
	FileBytes, LiveBytes int64
}

// Journal is the embedded [idemhttp.Journal]: one append-only file of
// checksummed records, mode 0600, locked so that only one Journal at
// a time (in any process) writes it, with an index of the entries in
// memory. The file format is described in docs/journal-format.md.
//
// # Durability
//
// Begin returns only once its entry is on disk: its record is appended to
// the batch being filled, one goroutine writes the batch with one
// synchronous write (a file opened O_DSYNC on Linux; a write and an
// fdatasync elsewhere), and only then is the entry published and Begin's
// caller woken (write, sync, publish). Concurrent calls share a batch
// (group commit), so under load durability costs a fraction of a sync
// per request, and a lone caller never waits for company: the next batch
// is sealed as soon as the previous sync returns.
//
// Finish is write-behind: its record joins the batch being filled and
// Finish returns without waiting for the sync, and without starting a
// commit of its own: the record goes with the next write someone waits
// for, so a lone caller's request costs about one sync (its Begin's),
// not two. That halves the syncs a request waits for and loses nothing:
// the outcome is on disk before any Begin that stores an entry after it
// returns, before Delete, Prune, Close or [Journal.Sync] returns, and
// otherwise within [WriteBehind] (20 ms) of the Finish, plus the
// commit's own time and any wait for a compaction's last step, which
// holds the file; if the process dies first, the entry is still pending
// after the restart, and [idemhttp.Client.Resume] resends it under the same key,
// which the server answers with its stored response instead of running
// the operation again. Delete and Prune wait for their sync.
//
// After a failed write or sync, or once the file was deleted or replaced
// underneath it, the journal takes no more writes until it is closed and
// opened again: the file's tail is unknown. An open of a file that was
// not closed cleanly writes its last batch again and syncs it before
// anything is appended: after a failed sync, Linux keeps the pages in
// its cache, readable, without ever writing them (the fsync-gate
// problem), and nothing may be built on bytes that only the cache holds. A Begin reported failed that
// way may still reappear after the reopen (its bytes may have reached the
// disk); it is then pending, and Resume sends it under its key. The
// journal relies on the local file system's locks and syncs: use local
// disks, not NFS or other network file systems.
//
// # Recovery
//
// [Open] replays the file into the index (see Space for the
// index file that spares most of that). Close ends the file
// with a marker, so a journal that was closed cleanly cannot end in a
// torn write: damage anywhere before the marker gives an error wrapping
// [ErrCorrupt]. After a crash, a last batch that is incomplete or
// damaged, with nothing valid after it, is most likely a group commit
// that the crash interrupted before anyone was told it succeeded; but
// damage to the last batches written before a crash looks the same, so
// the tail is not just deleted: it is moved into a file beside the journal
// ([Stats.TornFile]). A damaged batch followed by a valid one is
// damage to data that was acknowledged, and gives an error wrapping
// [ErrCorrupt] (see [Options.SkipVerify]). Every entry read
// back from the file is checked against its CRC again.
//
// # Space
//
// Records are never rewritten in place. The file's tail is preallocated
// with zeros, a quarter of the file at a time (at most 4 MiB), so that a
// commit's sync writes only its data: the file's size on disk runs
// ahead of [Stats.FileBytes] by up to that much. When pruned and deleted entries
// make up more than half of the file, and at least 1 MiB of it, Prune and
// Open rewrite it with only the live entries (see
// [Journal.Compact]). Memory holds the index: about 120 to 150
// bytes per entry plus its key and operation id (180 to 200 bytes in all
// with a 36-byte key and a 12-byte operation id); request bodies and
// headers stay on disk. Done entries older than the retention (see
// [Journal.Retain]) are pruned in the background.
//
// A clean close of a journal of 8 MiB or more also writes the index
// itself to a file beside the journal, named after it with ".index" (mode
// 0600; it holds keys and operation ids, as the journal does, and
// nothing Entry.Sanitized removes): about 100 bytes per entry, written in
// 0.2 to 0.5 s for a million entries, and not written again by a close
// that has nothing new to add. A compaction writes one too, for the new
// file. The next open reads it instead of the whole file, and replays
// only the batches written after the point it names: about 0.3 to 0.5 s
// for a million entries of 1 KiB on a small two-core VM
// ([Stats.IndexLoaded]). The index file is used only when the
// journal still holds, at the offset it names, the very batch it was
// written after; anything else (a journal compacted, replaced, restored
// or cut since, an index file damaged or of another format, later
// batches that contradict it) makes the open ignore it and replay the
// whole file: the journal file is the one source of truth, and deleting
// the index file is always safe. An open from the index file does not
// read the old records, so damage to them is found when an entry is read
// back (its record's CRC) and by [Journal.Verify], which replays the
// whole file and compares it with the index. With SkipVerify, no index
// file is read, and a close removes it.
//
// Opening without a usable index file (a journal never closed cleanly
// nor compacted, say) reads the whole file to rebuild the index, reading
// and checking the file on one goroutine while another indexes what it
// read: about 0.1 s for 100 000 entries of 1 KiB and about 1.1 s for a
// million on a small two-core VM. Prune and compaction hold the index's
// lock a chunk of entries at a time and push their own
// writes to the disk a MiB at a time, so that a Begin meanwhile waits
// tens of milliseconds at most. Past a few million entries, the heap and
// the open time, which grow with the entries, are the limits: prune more
// often, or keep a journal per batch. bench/README.md has the
// measurements.
//
// # The clock
//
// The journal stamps entries and outcomes with its own clock, by which a
// [idemhttp.Client] ages them ([Journal.Now]): the machine's clock, plus
// the set-backs the journal has measured against the machine's uptime
// clock (on Linux CLOCK_BOOTTIME, which nobody can set, within one boot;
// elsewhere the process's monotonic clock, within the process). What it
// guarantees:
//
//   - Within one boot (Linux; elsewhere within one process), a clock set
//     back by more than [idemhttp.ClockTolerance], whether or not anything
//     was running to see it, never makes an entry look younger than the
//     time since it was created, by more than that: Resume and RefetchDone
//     judge the server's retention by the time that really passed. A jump
//     found is on disk before the call that found it returns, so it
//     outlives the boot too; one the boot ended before the journal read
//     the clock (every call reads it, and the pruner hourly) is lost with
//     the boot, as below.
//   - A clock found more than that below the latest time the journal holds,
//     with no such evidence of how far it went back (after a reboot),
//     makes every entry created before, for good, of unknown age
//     ([Journal.ClockDoubt]): never resent or refetched automatically.
//   - Not detected: a clock set back across a reboot by some amount, then
//     carried past the latest time the journal holds by more downtime than
//     that before the journal is next opened. Nothing on the machine can
//     tell that clock from a right one: keep the clock right at boot.
//
// docs/journal-format.md has the details, and what is kept in the file.
//
// Entries never hold what [idemhttp.Entry.Sanitized] removes (credentials,
// the key header, a URL's user part or fragment) nor a URL with a
// credential in its query, whatever the caller passes: the journal is the
// last line of defence for secrets at rest.
//
// A Journal is safe for concurrent use. Open one with
// [Open]; the zero value is not usable. Close it when done.
type Journal struct {
	log        *wal.Log
	fs         FS
	clock      func() time.Time
	omitBodies bool
	secrets    []string      // Options.SecretHeaders
	retention  atomic.Int64  // the longest retention a Client told it (Retain); 0: none yet, defaultRetention applies
	keepDone   time.Duration // Options.KeepDone
	salvage    bool          // SkipVerify
	readOnly   bool

	// mu guards the index. Lock order: the log's file lock (View,
	// Rewrite), then mu, then the log's own lock (Append).
	mu      sync.Mutex
	byKey   *table
	byOp    *table
	all     []*entry                // every entry indexed, in order, and some gone since: for scans a chunk at a time
	scanMu  sync.Mutex              // one scan of all at a time: it rewrites all
	pend    map[*wal.Batch]*pending // what each batch not yet on disk stores and deletes
	batchOf map[*entry]*wal.Batch   // the batch of each entry whose begin record is not on disk yet
	live    int64                   // bytes the index's entries would take in a compacted file
	pending int                     // indexed entries in state pending, for PendingCount
	durable int64                   // the end of the file's part the index reflects
	high    time.Time               // the high-water mark: see HighWater

	// The journal's clock (see Now). clockMu guards the fields below it;
	// it is taken last, after mu and inside the log's append.
	uptime     func() (bootID, time.Duration) // called with clockMu held
	clockMu    sync.Mutex
	clk        clockState
	clkGen     uint64     // counts the jumps found (clk.read's changes)
	clkWritten uint64     // the generation of the last witness record appended
	clkBatch   *wal.Batch // the batch that holds it
	clkKept    uint64     // the generation of the last witness record on disk (keepClock)
	witnessDue bool       // this process has written no witness record yet

	// While a compaction runs, the entries published after its snapshot
	// (their offsets move with the batches it copies), and those deleted
	// after it (marked goneLate).
	compacting bool
	moved      []*entry
	lateGone   []*entry

	// gen counts the files the journal has switched to. An entry whose
	// gen is behind was in the file before the last compaction: its
	// place in the new file is remap[slot] until the compaction's
	// fix-up pass, a chunk at a time, brings it up to date. That keeps
	// the switch, during which writers wait, from touching every entry.
	gen   uint8
	remap []place

	// fault, when set (by tests only, before any write), is called before
	// each commit's write ("write") and between the write and its sync
	// ("sync", which on Linux is part of the write), and its error is
	// taken as that step's.
	fault func(step string) error

	// hook, when set (by tests only), is called by a compaction after
	// the first chunk of its snapshot ("snapshot") and after it switched
	// files, before the fix-up pass ("switched"), with no lock held but
	// the compaction's own.
	hook func(point string)

	pruner *pruner // nil when pruning is off

	indexPath  string         // of the index file: see index.go
	indexTemps atomic.Uint64  // numbers its temporary files
	indexFrom  wal.Checkpoint // the index file's, if the open read it
}

var _ idemhttp.Journal = (*Journal)(nil)

// JournalSenders declares to [idemhttp.Client] that the journal is one
// process's: its file is locked against every other opener, so that only
// the Clients of this process, which share their senders' slots on it
// (through any wrappers that implement Unwrap, see [idemhttp.Journal]),
// send under its keys. The result's type is internal to idemhttp: only
// the project's own journals declare it.
func (j *Journal) JournalSenders() contract.Senders {
	return contract.Senders{Store: j, OneProcess: true}
}

// pending is what a batch not yet on disk stores and deletes.
type pending struct {
	begins, deletes []*entry
}

// entry is the index's view of one entry: its state, and where its
// begin record (with the request: method, URL, headers, body) is in the
// file. The index holds millions of them, so it is packed (80 bytes on
// 64-bit platforms, checked by TestFjEntrySize): the key and operation id
// share one string, times are kept as the file stores them (Unix seconds
// and nanoseconds), and the batch of a begin record not yet durable is in
// [Journal]'s batchOf, not here.
type entry struct {
	keyOp                  string // the key, then the operation id
	createdSec, updatedSec int64
	off                    int64 // the begin record's offset in the file
	attempts, lastStatus   int
	createdNs, updatedNs   uint32
	size                   int32  // the begin record's length, header included
	slot                   int32  // while gen is behind: the entry's place in the compaction's list (Journal.remap)
	keyLen                 uint16 // of keyOp's key; keys are at most MaxKeyLen bytes
	state                  byte
	deleting               bool  // a delete record is on its way
	gone                   bool  // dropped from the index
	unsynced               bool  // the begin record is not durable yet: batchOf has its batch
	goneLate               bool  // deleted while a compaction runs, after its snapshot
	gen                    uint8 // the file generation off and size are in: see Journal.placeLocked
}

// newFjEntry returns an index entry for a begin record of size bytes at
// off, its key and operation copied into one allocation.
func newFjEntry(key, operation string, created, updated time.Time, attempts, lastStatus int, state byte, off int64, size int) *entry {
	le := new(entry)
	*le = entryOf(key+operation, uint16(len(key)), created, updated, attempts, lastStatus, state, off, size)
	return le
}

// entryOf is the index entry newFjEntry makes, for keyOp, the key (of
// keyLen bytes) and the operation id in one string.
func entryOf(keyOp string, keyLen uint16, created, updated time.Time, attempts, lastStatus int, state byte, off int64, size int) entry {
	le := entry{keyOp: keyOp, keyLen: keyLen, attempts: attempts, lastStatus: lastStatus, state: state, off: off, size: int32(size)}
	le.createdSec, le.createdNs = splitTime(created)
	le.setUpdated(updated)
	return le
}

// place is where a compaction found an entry's begin record in the
// old file, and where it wrote it in the new one.
type place struct {
	le            *entry
	off, newOff   int64
	size, newSize int32
}

// placeLocked returns where le's begin record is in the current file.
func (j *Journal) placeLocked(le *entry) (int64, int32) {
	if le.gen != j.gen {
		p := &j.remap[le.slot]
		return p.newOff, p.newSize
	}
	return le.off, le.size
}

// snapLocked returns a copy of le placed in the current file, for a
// reader to use outside the index lock (and inside the log's View).
func (j *Journal) snapLocked(le *entry) entry {
	snap := *le
	snap.off, snap.size = j.placeLocked(le)
	return snap
}

func (le *entry) key() string       { return le.keyOp[:le.keyLen] }
func (le *entry) operation() string { return le.keyOp[le.keyLen:] }

// created and updated return the times as read back from the file: UTC,
// without a monotonic reading.
func (le *entry) created() time.Time { return unixTime(le.createdSec, le.createdNs) }
func (le *entry) updated() time.Time { return unixTime(le.updatedSec, le.updatedNs) }

func (le *entry) setUpdated(t time.Time) { le.updatedSec, le.updatedNs = splitTime(t) }

// setOutcome sets what an outcome changes: the state, the last status,
// the attempts (a total) and the time it was recorded.
func (le *entry) setOutcome(state byte, lastStatus, attempts int, updated time.Time) {
	le.state, le.lastStatus, le.attempts = state, lastStatus, attempts
	le.setUpdated(updated)
}

// compareCreated orders entries by created time, then key.
func compareCreated(a, b *entry) int {
	return cmp.Or(cmp.Compare(a.createdSec, b.createdSec), cmp.Compare(a.createdNs, b.createdNs), strings.Compare(a.key(), b.key()))
}

// entryOverhead approximates an index entry's memory and a compacted
// file's per-entry framing; see Journal's documentation.
const entryOverhead = 150

// Open opens the journal file at path, creating it (mode 0600)
// if it does not exist or is empty. An existing journal that others may
// read or write is tightened to mode 0600. A nil opts means the defaults.
//
// If another Journal, in this process or another, has the file open
// for writing, Open fails at once with an error wrapping
// [ErrLocked] (but see [Options.ReadOnly]). A file that is
// not a journal gives an error wrapping [ErrNotJournal], and is left as it
// was; a journal in a format this build does not read gives
// [ErrVersion]; a damaged one, [ErrCorrupt] (but see
// [Options.SkipVerify]). An incomplete last batch after a crash is
// cut off and kept aside (see [Journal]). Open reads the
// whole file to build its index (or the index file a clean close or a
// compaction wrote, and what follows it: see [Journal]), and
// compacts it when that would halve it.
func Open(path string, opts *Options) (*Journal, error) {
	if opts == nil {
		opts = &Options{}
	}
	j := &Journal{
		fs:         opts.FS,
		clock:      opts.Clock,
		omitBodies: opts.OmitBodies,
		secrets:    slices.Clone(opts.SecretHeaders),
		salvage:    opts.SkipVerify,
		readOnly:   opts.ReadOnly,
		pend:       make(map[*wal.Batch]*pending),
		batchOf:    make(map[*entry]*wal.Batch),
	}
	if j.clock == nil {
		j.clock = time.Now
	}
	j.uptime = uptimeFunc(opts)
	if j.fs == nil {
		j.fs = wal.OS{}
	}
	var fileSize int64
	if fi, err := j.fs.Stat(path); err == nil {
		fileSize = fi.Size()
	}
	open := func(idx *index, resume func(uint64) (wal.Checkpoint, func() error, bool)) (*wal.Log, error) {
		idx.fileSize = fileSize
		return wal.Open(path, &wal.Options{
			Resume:    resume,
			OnClose:   j.writeIndex,
			ReadOnly:  opts.ReadOnly,
			Salvage:   opts.SkipVerify,
			LazyDelay: opts.writeBehind,
			OnCommit:  j.onCommit,
			Digest:    digest,
			FS:        j.fs,
			Rand:      opts.Rand,
			Clock:     j.clock,
			Fault: func(step string) error {
				if j.fault == nil {
					return nil
				}
				return j.fault(step)
			},
		}, idx.applyRecord)
	}
	// The index file the last clean close or compaction wrote, if any:
	// replay starts after the batch it names when the file still holds
	// it.
	j.indexPath = indexPath(j.fs, path)
	idx := newFjIndex()
	var xf *indexFile
	var resume func(uint64) (wal.Checkpoint, func() error, bool)
	if !opts.SkipVerify {
		xf = openFjIndex(j.fs, j.indexPath)
		defer xf.close()
		resume = xf.resume(idx)
	}
	log, err := open(idx, resume)
	if err != nil && xf != nil && xf.loaded {
		// The batches after the index file's checkpoint do not apply to
		// it (a delete of a key it lacks, say): whatever is wrong, the
		// index file is not what the journal says, and the journal is
		// the one to believe.
		idx = newFjIndex()
		log, err = open(idx, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, err)
	}
	j.log = log
	if log.Stats().Resumed {
		j.indexFrom = xf.cp
	}
	j.byKey, j.byOp, j.live, j.all, j.high = idx.byKey, idx.byOp, idx.live, idx.all, idx.high
	j.clk = idx.clk
	j.clk.mark = j.high
	j.witnessDue = true
	// A clock set back while no process had the journal open is found
	// now, and kept before anything is written under it.
	if _, err := j.nowKept(context.Background()); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("idemhttp: open journal %s: keep the clock's jump: %w", path, err)
	}
	for le := range j.byKey.all() {
		if le.state == journalStatePending {
			j.pending++
		}
	}
	j.durable = log.Size()
	if !j.readOnly && !j.salvage && j.worthCompacting() {
		// Best effort: a failed compaction leaves the file as it was,
		// a valid journal, and a later Prune tries again.
		_ = j.Compact(context.Background())
	}
	j.keepDone = max(opts.KeepDone, 0)
	if !j.readOnly && opts.PruneInterval >= 0 {
		j.pruner = startPruner(j, cmp.Or(opts.PruneInterval, time.Hour))
	}
	return j, nil
}

// Close writes what is still buffered (outcomes recorded by Finish) and
// a close marker, writes the index file of a large journal (see
// [Journal]; best effort: without one, the next open replays the
// file), then closes the file and releases its lock. It returns an error
// if that last write failed, or if an earlier one did. Later
// calls on the journal return [ErrClosed]; Close itself is
// idempotent.
func (j *Journal) Close() error {
	if j.pruner != nil {
		j.pruner.stop()
	}
	if err := j.log.Close(); err != nil {
		return fmt.Errorf("idemhttp: close journal: %w", err)
	}
	return nil
}

// Stats returns the journal's counters since it was opened.
func (j *Journal) Stats() Stats {
	st := j.log.Stats()
	j.mu.Lock()
	live := j.live
	j.mu.Unlock()
	return Stats{
		Writes: st.Writes, Commits: st.Commits, Compactions: st.Rewrites,
		TruncatedBytes: st.Truncated, TornFile: st.TornPath, CleanClose: st.Clean, IndexLoaded: st.Resumed,
		SkippedBytes: st.Skipped, FileBytes: st.Size, LiveBytes: live + wal.FileHeaderLen,
	}
}

// Sync returns once every record appended before it was called is on
// disk: in particular the outcomes that Finish records write-behind. It
// returns the error of a failed write, and ctx's error if ctx ends first.
func (j *Journal) Sync(ctx context.Context) error {
	if err := j.log.Flush(ctx); err != nil {
		return fmt.Errorf("idemhttp: journal sync: %w", err)
	}
	return nil
}

// Begin implements [idemhttp.Journal.Begin]. The operation id is looked up first,
// then the key: when both exist on different entries, the operation's entry
// is returned. The entry stored is what [idemhttp.Entry.Sanitized] makes of e
// with the journal's SecretHeaders, without its body with OmitBodies. e is not modified. Begin fails with an error
// wrapping [idemhttp.ErrInvalidKey] or [idemhttp.ErrInvalidRequest] for a bad key or
// operation id, before touching the file.
//
// ctx is checked before the entry joins a batch; once it has, Begin waits
// for the batch, since giving up then could report failure for a write
// that reaches the disk.
func (j *Journal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	rec, err := e.Sanitized(j.secrets...)
	if err != nil {
		return nil, err
	}
	if e.Created.IsZero() {
		if rec.Created, err = j.nowKept(ctx); err != nil {
			return nil, fmt.Errorf("idemhttp: journal begin %s: keep the clock's jump: %w", e.Key, err)
		}
		if e.Updated.IsZero() {
			rec.Updated = rec.Created
		}
	}
	if j.omitBodies {
		rec.Body = nil
	}
	// Encoding outside the lock keeps the critical section, which every
	// concurrent writer waits on, to a copy.
	bp := encodeBufs.Get()
	defer encodeBufs.Put(bp)
	encoded, err := appendBegin((*bp)[:0], rec)
	*bp = encoded
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
	}

	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		j.mu.Lock()
		if err := j.log.Writable(); err != nil {
			j.mu.Unlock()
			return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
		}
		found := j.lookupLocked(rec.Operation, rec.Key)
		if found == nil {
			// The clock's witness goes with it, when due: after it,
			// so that off is the begin record's.
			w, gen := j.clockRecord(true, true)
			b, off, retry, err := j.appendLocked(false, len(encoded)+len(w), 1, func(buf []byte) []byte { return append(append(buf, encoded...), w...) })
			if retry {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
			}
			if w != nil {
				j.clockWritten(gen, b)
			}
			j.indexBeginLocked(rec, b, off, len(encoded))
			j.mu.Unlock()
			<-b.Done()
			if err := b.Err(); err != nil {
				return nil, fmt.Errorf("idemhttp: journal begin %s: %w", rec.Key, err)
			}
			return nil, nil
		}
		if found.unsynced {
			// Stored by a Begin whose batch is not on disk yet: its
			// outcome decides. (A failed batch's entries leave the index
			// with it, and batchOf then: b is nil only for one of those,
			// which a lookup cannot return.)
			b := j.batchOf[found]
			j.mu.Unlock()
			if b != nil {
				select {
				case <-b.Done():
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			continue
		}
		key := found.key()
		j.mu.Unlock()
		existing, err := j.read(key)
		if errors.Is(err, idemhttp.ErrNotFound) {
			continue // deleted in between: look again
		}
		if err != nil {
			return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
		}
		return existing, nil
	}
}

// appendLocked appends records to the log, called with the index lock
// held: with [wal.Log.AppendLazy] when lazy, else [wal.Log.Append]. On
// success the lock is still held, for the caller to index what it
// appended in the same critical section. Otherwise it has released it:
// with the batch full it waits for the committer to take that batch (a
// batch must stay within what replay accepts) and reports retry, and the
// caller looks at the index again, since it may have changed meanwhile;
// any other error it returns.
func (j *Journal) appendLocked(lazy bool, need, records int, fn func([]byte) []byte) (b *wal.Batch, off int64, retry bool, err error) {
	if lazy {
		b, off, err = j.log.AppendLazy(need, records, fn)
	} else {
		b, off, err = j.log.Append(need, records, fn)
	}
	if err == nil {
		return b, off, false, nil
	}
	j.mu.Unlock()
	if errors.Is(err, wal.ErrBatchFull) {
		<-b.Done()
		return nil, 0, true, nil
	}
	return nil, 0, false, err
}

// encodeBufs holds encoding buffers, so that a Begin allocates none.
var encodeBufs = &wal.Bufs{}

// lookupLocked returns the entry for operation (when not empty) or, failing
// that, for key.
func (j *Journal) lookupLocked(operation, key string) *entry {
	if operation != "" {
		if le := j.byOp.get(operation); le != nil {
			return le
		}
	}
	return j.byKey.get(key)
}

// pendingLocked returns what batch b, not yet on disk, stores and deletes.
func (j *Journal) pendingLocked(b *wal.Batch) *pending {
	p := j.pend[b]
	if p == nil {
		p = &pending{}
		j.pend[b] = p
	}
	return p
}

// indexBeginLocked indexes the entry whose begin record of size bytes
// was appended at off in batch b, reserved until the batch is durable.
func (j *Journal) indexBeginLocked(rec *idemhttp.Entry, b *wal.Batch, off int64, size int) {
	le := newFjEntry(rec.Key, rec.Operation, rec.Created, rec.Updated, rec.Attempts, rec.LastStatus, journalStatePending, off, size)
	le.unsynced, le.gen = true, j.gen
	j.batchOf[le] = b
	p := j.pendingLocked(b)
	p.begins = append(p.begins, le)
	j.all = append(j.all, le)
	j.byKey.put(le)
	if le.operation() != "" {
		j.byOp.put(le)
	}
	j.live += int64(size) + entryOverhead
	j.pending++
	// Raised before the batch is durable, and not lowered if it fails: a
	// mark too high only makes the clock checks stricter.
	j.raiseLocked(rec.Created)
	j.raiseLocked(rec.Updated)
}

// onCommit publishes a batch once it is on disk, or drops what it stored
// if it failed. It runs on the log's committer, before the batch's
// waiters are woken.
func (j *Journal) onCommit(b *wal.Batch, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := j.pend[b]
	delete(j.pend, b)
	if err == nil {
		j.durable = b.End()
	}
	if p == nil {
		return
	}
	if err != nil {
		for _, le := range p.begins {
			delete(j.batchOf, le)
			if j.byKey.get(le.key()) == le {
				j.unindexLocked(le)
			}
		}
		for _, le := range p.deletes {
			le.deleting = false
		}
		return
	}
	for _, le := range p.begins {
		le.unsynced = false
		delete(j.batchOf, le)
	}
	if j.compacting {
		j.moved = append(j.moved, p.begins...)
	}
	for _, le := range p.deletes {
		if j.byKey.get(le.key()) == le {
			j.unindexLocked(le)
			if j.compacting {
				le.goneLate = true
				j.lateGone = append(j.lateGone, le)
			}
		}
	}
}

// unindexLocked drops le from the index.
func (j *Journal) unindexLocked(le *entry) {
	le.gone = true
	j.byKey.del(le.key())
	if le.state == journalStatePending {
		j.pending--
	}
	if le.operation() != "" && j.byOp.get(le.operation()) == le {
		j.byOp.del(le.operation())
	}
	j.live -= int64(le.size) + entryOverhead
}

// Finish implements [idemhttp.Journal.Finish]: it adds o.Attempts to the entry's
// attempts and sets its state, last status and Updated time (o.At, or now
// when zero). o.State must be one of the three states; a call that ended
// without a definite outcome records [idemhttp.StatePending] again. Finish
// returns an error wrapping [idemhttp.ErrNotFound] for an unknown key. A
// done or abandoned entry is final: Finish with its own state adds the
// attempts only, with another state it changes nothing and returns an
// error wrapping [idemhttp.ErrFenced].
//
// The new state is visible at once to this journal's readers; its record
// is written behind, within [WriteBehind] (see [Journal]).
// Finish does not wait for the disk, so ctx is only checked on entry;
// except when, stamping the time (o.At zero), it finds the clock jumped:
// it then keeps the jump on disk first, waits for that one sync, and
// returns ctx's error should it end meanwhile (see [Journal.Now]). A
// result (o.Result) or parked time (o.NotBefore) is written and waited
// for.
func (j *Journal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	o, err := o.Sanitized()
	if err != nil {
		return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
	}
	state, _ := journalStateByte(o.State)
	at := o.At
	if at.IsZero() {
		if at, err = j.nowKept(ctx); err != nil {
			return fmt.Errorf("idemhttp: journal finish %s: keep the clock's jump: %w", key, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if (o.Result != nil && state == journalStateDone) || (!o.NotBefore.IsZero() && state == journalStatePending) {
		if err := j.finishWithResult(ctx, key, o, at); !errors.Is(err, errNoResult) {
			return err
		}
		// The entry is final already, or its record too large: a plain
		// outcome (a park then lost: the entry is pending, and a resend
		// before the server's time is told to wait again).
	}
	for {
		j.mu.Lock()
		le := j.byKey.get(key)
		ok := le != nil
		if !ok || le.deleting {
			j.mu.Unlock()
			if err := j.log.Writable(); err != nil {
				return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
			}
			return fmt.Errorf("idemhttp: journal finish %s: %w", key, idemhttp.ErrNotFound)
		}
		status, when := o.Status, at
		if le.state != journalStatePending {
			// Final: another state is a stale writer's word; the same
			// state (a second sender that got the replay) only counts
			// its attempts, and leaves the status and the time.
			if le.state != state {
				j.mu.Unlock()
				return fmt.Errorf("idemhttp: journal finish %s: %w: the entry is %s", key, idemhttp.ErrFenced, journalStateOf(le.state))
			}
			if o.Attempts == 0 {
				j.mu.Unlock()
				return nil
			}
			status, when = le.lastStatus, le.updated()
		}
		// Attempts are stored as a total: see the finish record's format.
		attempts := le.attempts + o.Attempts
		// Lazy: the record waits for the next Begin's commit (or the
		// bound) instead of starting one nobody waits for.
		w, gen := j.clockRecord(true, false)
		b, _, retry, err := j.appendLocked(true, finishMax(key)+len(w), 1, func(buf []byte) []byte {
			return append(appendFinish(buf, key, state, status, attempts, when), w...)
		})
		if retry {
			continue
		}
		if err != nil {
			return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
		}
		if w != nil {
			j.clockWritten(gen, b)
		}
		if was, now := le.state == journalStatePending, state == journalStatePending; was != now {
			if now {
				j.pending++
			} else {
				j.pending--
			}
		}
		le.setOutcome(state, status, attempts, when)
		j.raiseLocked(when)
		j.mu.Unlock()
		return nil
	}
}

// errNoResult: Finish cannot keep the result or the not-before (the entry
// is final already, or its record would be too large): it records the
// outcome alone.
var errNoResult = errors.New("no result kept")

// finishWithResult records a done outcome with its result, or a pending
// one with its not-before (a parked operation): a result or parked
// record, the entry's begin record written again with the result or the
// time after it, which replaces the begin record
// (docs/journal-format.md). Unlike a plain Finish it waits for the disk:
// the index points at the new record only once it is durable and
// readable, and a Get meanwhile reads the old one. It holds the scan
// lock, so no compaction or removal moves the entry meanwhile, and sets
// the entry's outcome at once, as Finish does, so that no Delete or
// Prune removes a done entry before its record lands.
func (j *Journal) finishWithResult(ctx context.Context, key string, o idemhttp.Outcome, at time.Time) error {
	j.scanMu.Lock()
	defer j.scanMu.Unlock()
	cur, err := j.read(key)
	if err != nil {
		if errors.Is(err, idemhttp.ErrNotFound) {
			return errNoResult // Finish reports it
		}
		return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
	}
	if cur.State != idemhttp.StatePending {
		return errNoResult
	}
	rec := *cur
	rec.State, rec.LastStatus, rec.Attempts, rec.Updated = o.State, o.Status, cur.Attempts+o.Attempts, at
	rec.Result, rec.NotBefore = o.Result, o.NotBefore // sanitised by Finish: one of them, with its state
	state, _ := journalStateByte(o.State)
	// Append copies the record into its batch before it returns, so the
	// buffer goes back to the pool when this call does.
	bp := encodeBufs.Get()
	defer encodeBufs.Put(bp)
	encoded, err := appendBegin((*bp)[:0], &rec)
	*bp = encoded
	if err != nil {
		return errNoResult // too large to keep: the outcome alone
	}
	for {
		j.mu.Lock()
		le := j.byKey.get(key)
		if le == nil || le.deleting || le.state != journalStatePending {
			j.mu.Unlock()
			return errNoResult
		}
		b, off, retry, err := j.appendLocked(false, len(encoded), 1, func(buf []byte) []byte { return append(buf, encoded...) })
		if retry {
			continue
		}
		if err != nil {
			return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
		}
		if state != journalStatePending {
			j.pending--
		}
		le.setOutcome(state, rec.LastStatus, rec.Attempts, at)
		j.raiseLocked(at)
		j.mu.Unlock()
		<-b.Done()
		if err := b.Err(); err != nil {
			return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
		}
		j.mu.Lock()
		if le := j.byKey.get(key); le != nil && !le.deleting {
			j.live += int64(len(encoded)) - int64(le.size)
			le.off, le.size, le.gen = off, int32(len(encoded)), j.gen
		}
		j.mu.Unlock()
		return nil
	}
}

// Get implements [idemhttp.Journal.Get]. An entry whose Begin is not yet durable
// is not found.
func (j *Journal) Get(ctx context.Context, key string) (*idemhttp.Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e, err := j.read(key)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal get %s: %w", key, err)
	}
	return e, nil
}

// Lookup implements [idemhttp.Journal.Lookup] from the index alone: the entry has
// no Method, URL, Header, Body or Fingerprint, and nothing is read from
// the file. An entry whose Begin is not yet durable is not found.
func (j *Journal) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := j.log.Writable(); errors.Is(err, ErrClosed) {
		return nil, fmt.Errorf("idemhttp: journal lookup %s: %w", operation, err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	var le *entry
	if operation != "" {
		le = j.byOp.get(operation)
	}
	if le == nil || le.unsynced || le.deleting {
		return nil, fmt.Errorf("idemhttp: journal lookup %s: %w", operation, idemhttp.ErrNotFound)
	}
	return &idemhttp.Entry{
		Operation: le.operation(), Key: le.key(), Created: le.created(), Updated: le.updated(),
		Attempts: le.attempts, LastStatus: le.lastStatus, State: journalStateOf(le.state),
	}, nil
}

// read returns the durable entry for key, its request read back from the
// file and checked.
func (j *Journal) read(key string) (*idemhttp.Entry, error) {
	var e *idemhttp.Entry
	err := j.log.View(func(r wal.Reader) error {
		j.mu.Lock()
		le := j.byKey.get(key)
		ok := le != nil
		if !ok || le.unsynced {
			j.mu.Unlock()
			return idemhttp.ErrNotFound
		}
		snap := j.snapLocked(le)
		j.mu.Unlock()
		var err error
		e, err = readEntry(r, &snap, nil)
		return err
	})
	return e, err
}

// readEntry reads le's begin record into an Entry with le's state,
// using buf for the read if it is large enough.
func readEntry(r wal.Reader, le *entry, buf []byte) (*idemhttp.Entry, error) {
	payload, err := r.Record(le.off, int(le.size), buf)
	if err != nil {
		return nil, fmt.Errorf("entry %s: %w", le.key(), err)
	}
	rec, err := decodeRecord(payload)
	if err != nil {
		return nil, fmt.Errorf("entry %s: %w", le.key(), err)
	}
	if (rec.kind != kindBegin && rec.kind != kindResult && rec.kind != kindParked) || rec.key != le.key() {
		return nil, fmt.Errorf("%w: entry %s: the record at offset %d is not its own", ErrCorrupt, le.key(), le.off)
	}
	e := rec.entry()
	if rec.kind == kindParked && (le.state != rec.state || le.attempts != rec.attempts || le.lastStatus != rec.lastStatus || !le.updated().Equal(rec.updated)) {
		// A finish record came after the parked one: a resend's outcome,
		// which ends the park (see kindParked).
		e.NotBefore = time.Time{}
	}
	e.State, e.Updated, e.Attempts, e.LastStatus = journalStateOf(le.state), le.updated(), le.attempts, le.lastStatus
	return e, nil
}

// Pending implements [idemhttp.Journal.Pending]: entries in state pending, oldest
// Created first (ties in key order).
func (j *Journal) Pending(ctx context.Context) ([]*idemhttp.Entry, error) {
	out, err := j.list(ctx, func(le *entry) bool { return le.state == journalStatePending })
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal pending: %w", err)
	}
	return out, nil
}

// Entries returns every entry in the journal, whatever its state, oldest
// Created first (ties in key order). It is meant for inspection tools; it
// reads every entry's request back from the file. A damaged entry gives an
// error wrapping [ErrCorrupt] that names its key.
func (j *Journal) Entries(ctx context.Context) ([]*idemhttp.Entry, error) {
	out, err := j.list(ctx, func(*entry) bool { return true })
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal entries: %w", err)
	}
	return out, nil
}

// list returns the durable entries that keep selects, oldest first.
func (j *Journal) list(ctx context.Context, keep func(*entry) bool) ([]*idemhttp.Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*idemhttp.Entry
	err := j.log.View(func(r wal.Reader) error {
		var snaps []entry
		j.mu.Lock()
		for le := range j.byKey.all() {
			if !le.unsynced && !le.deleting && keep(le) {
				snaps = append(snaps, j.snapLocked(le))
			}
		}
		j.mu.Unlock()
		slices.SortFunc(snaps, func(a, b entry) int { return compareCreated(&a, &b) })
		out = make([]*idemhttp.Entry, 0, len(snaps))
		var buf []byte
		for i := range snaps {
			if err := ctx.Err(); err != nil {
				return err
			}
			e, err := readEntry(r, &snaps[i], buf)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Prune implements [idemhttp.Journal.Prune]: it deletes the done entries updated
// before cutoff with one delete record each, in group commits of at most
// removeChunk records, and then compacts the file if that would halve
// it (see [Journal.Compact]). A failed compaction is not Prune's
// error: the file stays as it was and the next Prune tries again.
func (j *Journal) Prune(ctx context.Context, cutoff time.Time) (int, error) {
	n, err := j.remove(ctx, func(le *entry) bool {
		return le.state == journalStateDone && le.updated().Before(cutoff)
	})
	if err != nil {
		return n, fmt.Errorf("idemhttp: journal prune: %w", err)
	}
	if n > 0 {
		// Best effort: a failed compaction leaves the file as it was, a
		// valid journal, and the next Prune tries again. Prune's own work
		// is done and durable.
		_ = j.maybeCompact(ctx)
	}
	return n, nil
}

// Delete implements [idemhttp.Journal.Delete]: it withdraws the pending
// entry for key, durably. It returns an error wrapping
// [idemhttp.ErrNotFound] for an unknown key, and one wrapping
// [idemhttp.ErrFenced] for a final entry: a done one, which only Prune
// removes, or an abandoned one, which keeps its operation's key until a
// person resolves it and removes it with [Journal.Forget].
//
// Deleting a pending entry forgets an operation whose outcome is unknown:
// rerunning it mints a new key and may run it twice, unless it provably
// never reached the wire (the only case in which a Client deletes one).
func (j *Journal) Delete(ctx context.Context, key string) error {
	return j.delete(ctx, "delete", key, func(e *entry) bool { return e.state == journalStatePending })
}

// Forget removes the pending or abandoned entry for key, durably: an
// operator's act (idemctl prune -include-pending), for an entry a person
// has resolved. It returns an error wrapping [idemhttp.ErrNotFound] for
// an unknown key, and one wrapping [idemhttp.ErrFenced] for a done entry,
// which only Prune removes.
//
// Forgetting an entry forgets an operation whose outcome is unknown (or,
// abandoned, that may have run): rerunning it mints a new key and may run
// it twice. A Client never calls it.
func (j *Journal) Forget(ctx context.Context, key string) error {
	return j.delete(ctx, "forget", key, func(e *entry) bool { return e.state != journalStateDone })
}

// delete removes key's entry if doomed says so; an entry it keeps is
// ErrFenced.
func (j *Journal) delete(ctx context.Context, what, key string, doomed func(*entry) bool) error {
	err := ctx.Err()
	n := 0
	var le *entry
	if err == nil {
		j.mu.Lock()
		le = j.byKey.get(key)
		err = j.log.Writable()
		j.mu.Unlock()
		if err == nil && le != nil {
			n, err = j.removeChunk([]*entry{le}, doomed)
		}
	}
	if err == nil && n == 0 {
		err = idemhttp.ErrNotFound
		if le != nil {
			j.mu.Lock()
			if cur := j.byKey.get(key); cur != nil && !cur.gone && !cur.deleting && !cur.unsynced {
				err = fmt.Errorf("%w: the entry is %s", idemhttp.ErrFenced, journalStateOf(cur.state))
			}
			j.mu.Unlock()
		}
	}
	if err != nil {
		return fmt.Errorf("idemhttp: journal %s %s: %w", what, key, err)
	}
	return nil
}

// removeChunk bounds the delete records remove appends at once, and the
// entries it (and a compaction) looks at per hold of the index lock, so
// that neither the lock nor one batch grows with the journal. A Begin
// that joins a batch behind a chunk of deletes waits for its sync: at
// 4096 records (about 180 KB) that was about 20 ms on a small VM's disk.
const removeChunk = 1024

// remove appends a delete record for every durable entry that doomed
// selects, a chunk at a time, waits for them to be on disk, and drops
// the entries from the index. It returns how many it removed. It scans
// the entries a chunk at a time, releasing the index lock in between,
// and drops the gone ones from the list it scans as it goes.
func (j *Journal) remove(ctx context.Context, doomed func(*entry) bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := j.log.Writable(); err != nil {
		return 0, err
	}
	j.scanMu.Lock()
	defer j.scanMu.Unlock()
	var kept []*entry
	removed := 0
	for i := 0; ; {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		j.mu.Lock()
		if i >= len(j.all) {
			// Entries appended during the scan were looked at too; the
			// list is now the live ones, in order.
			j.all = append(kept, j.all[i:]...)
			j.mu.Unlock()
			return removed, nil
		}
		end := min(i+removeChunk, len(j.all))
		var les []*entry
		for _, le := range j.all[i:end] {
			switch {
			case le.gone:
			case !le.unsynced && !le.deleting && doomed(le):
				les = append(les, le)
			default:
				kept = append(kept, le)
			}
		}
		i = end
		j.mu.Unlock()
		if len(les) > 0 {
			n, err := j.removeChunk(les, doomed)
			removed += n
			j.mu.Lock()
			for _, le := range les {
				if !le.gone { // not deleted after all: still listed
					kept = append(kept, le)
				}
			}
			j.mu.Unlock()
			if err != nil {
				// The list keeps everything from here on.
				j.mu.Lock()
				j.all = append(kept, j.all[i:]...)
				j.mu.Unlock()
				return removed, err
			}
		}
	}
}

// removeChunk deletes the entries of les that are still in the index and
// still doomed, in one batch, and waits for it.
func (j *Journal) removeChunk(les []*entry, doomed func(*entry) bool) (int, error) {
	for {
		j.mu.Lock()
		var keep []*entry
		need := 0
		for _, le := range les {
			if !le.gone && !le.unsynced && !le.deleting && doomed(le) {
				keep = append(keep, le)
				need += deleteMax(le.key())
			}
		}
		if len(keep) == 0 {
			j.mu.Unlock()
			return 0, nil
		}
		// The batch also records when it ran: a delete is the journal
		// seeing the clock, and the entries it drops may have held the
		// latest times, so the high-water mark (HighWater) must not go
		// with them. (Without it, a clock set forward, then back while
		// only pruning ran, went unnoticed.) Not counted in Writes.
		now, _ := j.now() // a jump found is in this batch, waited for
		now = now.Round(0)
		w, gen := j.clockRecord(true, true)
		b, _, retry, err := j.appendLocked(false, clockMax+need+len(w), len(keep), func(buf []byte) []byte {
			buf = appendClock(buf, now)
			for _, le := range keep {
				buf = appendDelete(buf, le.key())
			}
			return append(buf, w...)
		})
		if retry {
			continue
		}
		if err != nil {
			return 0, err
		}
		if w != nil {
			j.clockWritten(gen, b)
		}
		for _, le := range keep {
			le.deleting = true
		}
		j.raiseLocked(now)
		p := j.pendingLocked(b)
		p.deletes = append(p.deletes, keep...)
		j.mu.Unlock()
		<-b.Done()
		if err := b.Err(); err != nil {
			return 0, err
		}
		return len(keep), nil
	}
}

// Verify reads the whole file again and reports the first problem as an
// error wrapping [ErrCorrupt]: a batch or record that fails its
// checksum, a record that does not decode, a record about an entry that
// does not exist, or an entry the file and the index disagree on. It
// only reads, and works on a journal opened [Options.ReadOnly].
func (j *Journal) Verify(ctx context.Context) error {
	if err := j.verify(ctx); err != nil {
		return fmt.Errorf("idemhttp: journal verify: %w", err)
	}
	return nil
}
