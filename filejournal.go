package idemhttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// JournalOptions configures [OpenFileJournal]. A nil *JournalOptions and
// the zero value both mean the defaults: bodies stored, the standard
// credentials withheld, damage refused.
type JournalOptions struct {
	// OmitBodies keeps request bodies out of the file; fingerprints are
	// still stored. Use it when bodies hold data that must not rest on
	// disk. An entry without its body cannot be resent by Resume: it can
	// only be reported.
	OmitBodies bool

	// SecretHeaders names request headers never written to the file, in
	// addition to Authorization, Cookie and Proxy-Authorization, which are
	// always withheld. Names are matched case-insensitively.
	SecretHeaders []string

	// SkipVerify opens a damaged journal instead of refusing it, for
	// inspection and repair: damaged batches in the middle of the file are
	// skipped, with the entries they held, and records that refer to
	// skipped entries are ignored. [FileJournal.Verify] still reports the
	// damage; [FileJournal.Compact] rewrites the file without it. Entries
	// lost this way may be operations whose outcome is unknown, so a
	// repaired journal needs a person's review.
	SkipVerify bool
}

// JournalStats counts a [FileJournal]'s work since it was opened.
type JournalStats struct {
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

	// TruncatedBytes is the size of the incomplete tail that
	// [OpenFileJournal] cut off: a group commit that a crash interrupted
	// before any caller was told it succeeded.
	TruncatedBytes int64

	// SkippedBytes is the size of the damaged batches that
	// [JournalOptions.SkipVerify] skipped when the file was opened, until
	// [FileJournal.Compact] rewrites the file without them (then 0).
	SkippedBytes int64

	// FileBytes is the size of the file's durable part. LiveBytes
	// estimates the size it would have if compacted now, erring high: it
	// counts 150 bytes of overhead per entry, about what the entry costs
	// in memory, where the file spends a few dozen.
	FileBytes, LiveBytes int64
}

// FileJournal is the embedded [Journal]: one append-only file of
// checksummed records, mode 0600, locked so that only one FileJournal at
// a time (in any process) has it open, with an index of the entries in
// memory. The format is described in filejournal_codec.go.
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
// Finish is write-behind: its record joins the next batch and Finish
// returns without waiting for the sync. That halves the syncs a request
// waits for and loses nothing: the outcome is on disk before any Begin
// that stores an entry after it returns, and before Close or
// [FileJournal.Sync] returns;
// if the process dies first, the entry is still pending after the
// restart, and [Client.Resume] resends it under the same key, which the
// server answers with its stored response instead of running the
// operation again. Delete and Prune wait for their sync.
//
// # Recovery
//
// [OpenFileJournal] replays the file into the index. A batch that is
// incomplete or damaged, with nothing valid after it, is a group commit
// that a crash interrupted before anyone was told it succeeded: it is cut
// off ([JournalStats.TruncatedBytes]). A damaged batch followed by a
// valid one is damage to data that was acknowledged, and gives an error
// wrapping [ErrJournalCorrupt] (see [JournalOptions.SkipVerify]). Every
// entry read back from the file is checked against its CRC again.
//
// # Space
//
// Records are never rewritten in place. When pruned and deleted entries
// make up more than half of the file, and at least 1 MiB of it, Prune and
// OpenFileJournal rewrite it with only the live entries (see
// [FileJournal.Compact]). Memory holds about 150 bytes per entry plus its
// key and operation id; request bodies and headers stay on disk.
//
// Entries never hold the Authorization, Cookie or Proxy-Authorization
// headers, nor any header in [JournalOptions.SecretHeaders], nor a URL
// password, whatever the caller passes: the journal is the last line of
// defence for secrets at rest.
//
// A FileJournal is safe for concurrent use. Open one with
// [OpenFileJournal]; the zero value is not usable. Close it when done.
type FileJournal struct {
	path       string
	omitBodies bool
	secret     map[string]bool // canonical header names never stored
	salvage    bool            // SkipVerify

	// fileMu guards the file itself: held shared by every read and by the
	// committer for its write and sync, exclusively by compaction, which
	// replaces the file. Lock order: fileMu, then mu.
	fileMu sync.RWMutex
	f      *os.File

	mu       sync.Mutex
	idle     sync.Cond // broadcast when a commit ends
	byKey    map[string]*fjEntry
	byOp     map[string]string
	cur      *fjBatch // the batch being filled
	inflight *fjBatch // the batch being written, nil if none
	closed   bool
	broken   error  // a write or sync failed: the file's tail is unknown, so writes stop
	live     int64  // bytes the index's entries would take in a compacted file
	pending  int    // entries of byKey in state pending, for PendingCount
	seq      uint64 // the last durable batch's sequence number
	salt     uint64 // the file's salt (see filejournal_codec.go)

	kick     chan struct{} // wakes the committer; capacity 1
	stop     chan struct{} // closed by Close
	loopDone chan struct{} // closed when the committer has returned

	// fault, when set (by tests only, before any write), is called before
	// each commit's write ("write") and between the write and its sync
	// ("sync", which on Linux is part of the write), and its error is
	// taken as that step's.
	fault func(step string) error

	writes, commits, compactions atomic.Uint64
	truncated, skipped           int64
	size                         atomic.Int64
}

var _ Journal = (*FileJournal)(nil)

// fjEntry is the index's view of one entry: its state, and where its
// begin record (with the request: method, URL, headers, body) is in the
// file.
type fjEntry struct {
	key, operation string
	created        time.Time
	updated        time.Time
	attempts       int
	lastStatus     int
	state          byte
	deleting       bool     // a delete record is on its way
	off            int64    // the begin record's offset in the file
	size           int32    // the begin record's length, header included
	batch          *fjBatch // until the begin record is durable; nil after
}

// fjEntryOverhead approximates an index entry's memory and a compacted
// file's per-entry framing; see FileJournal's documentation.
const fjEntryOverhead = 150

// OpenFileJournal opens the journal file at path, creating it (mode 0600)
// if it does not exist or is empty. An existing file that others may read
// or write is tightened to mode 0600. A nil opts means the defaults.
//
// If another FileJournal, in this process or another, has the file open,
// OpenFileJournal fails at once with an error wrapping [ErrJournalLocked].
// A file that is not a journal, or is damaged, gives an error wrapping
// [ErrJournalCorrupt] (but see [JournalOptions.SkipVerify]); an
// incomplete last batch is cut off. OpenFileJournal reads the whole file
// to build its index, and compacts it when that would halve it.
func OpenFileJournal(path string, opts *JournalOptions) (*FileJournal, error) {
	if opts == nil {
		opts = &JournalOptions{}
	}
	j := &FileJournal{
		path:       path,
		omitBodies: opts.OmitBodies,
		salvage:    opts.SkipVerify,
		secret: map[string]bool{
			"Authorization":       true,
			"Cookie":              true,
			"Proxy-Authorization": true,
		},
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	for _, name := range opts.SecretHeaders {
		j.secret[http.CanonicalHeaderKey(name)] = true
	}
	j.idle.L = &j.mu
	if err := j.open(); err != nil {
		return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, err)
	}
	go j.commitLoop()
	return j, nil
}

// Close writes what is still buffered (outcomes recorded by Finish), then
// closes the file and releases its lock. It returns an error if that last
// write failed, or if an earlier one did. Later calls on the journal
// return [ErrJournalClosed]; Close itself is idempotent.
func (j *FileJournal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	j.mu.Unlock()
	close(j.stop)
	<-j.loopDone
	j.fileMu.Lock()
	defer j.fileMu.Unlock()
	err := j.f.Close()
	j.mu.Lock()
	broken := j.broken
	j.mu.Unlock()
	if broken != nil {
		return fmt.Errorf("idemhttp: close journal: %w", broken)
	}
	if err != nil {
		return fmt.Errorf("idemhttp: close journal: %w", err)
	}
	return nil
}

// Stats returns the journal's counters since it was opened.
func (j *FileJournal) Stats() JournalStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	return JournalStats{
		Writes: j.writes.Load(), Commits: j.commits.Load(), Compactions: j.compactions.Load(),
		TruncatedBytes: j.truncated, SkippedBytes: j.skipped,
		FileBytes: j.size.Load(), LiveBytes: j.live + fjFileHdrLen,
	}
}

// Sync returns once every record appended before it was called is on
// disk: in particular the outcomes that Finish records write-behind. It
// returns the error of a failed write, and ctx's error if ctx ends first.
func (j *FileJournal) Sync(ctx context.Context) error {
	j.mu.Lock()
	if err := j.writableLocked(); err != nil {
		j.mu.Unlock()
		return fmt.Errorf("idemhttp: journal sync: %w", err)
	}
	b := j.cur
	if b.empty() {
		b = j.inflight
	}
	j.mu.Unlock()
	if b == nil {
		return nil
	}
	j.wake()
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if b.err != nil {
		return fmt.Errorf("idemhttp: journal sync: %w", b.err)
	}
	return nil
}

// writableLocked reports why no record may be appended now, if so.
func (j *FileJournal) writableLocked() error {
	if j.closed {
		return ErrJournalClosed
	}
	return j.broken
}

// Begin implements [Journal.Begin]. The operation id is looked up first,
// then the key: when both exist on different entries, the operation's entry
// is returned. The entry stored is a sanitised copy of e: state pending,
// Created (and Updated) set to now when zero, secret headers, URL password
// and (with OmitBodies) the body removed. e is not modified. Begin fails
// with an error wrapping [ErrInvalidKey] or [ErrInvalidRequest] for a bad
// key or operation id, before touching the file.
//
// ctx is checked before the entry joins a batch; once it has, Begin waits
// for the batch, since giving up then could report failure for a write
// that reaches the disk.
func (j *FileJournal) Begin(ctx context.Context, e *Entry) (*Entry, error) {
	if e == nil {
		return nil, fmt.Errorf("idemhttp: journal begin: %w: nil entry", ErrInvalidRequest)
	}
	if err := ValidateKey(e.Key); err != nil {
		return nil, err
	}
	if e.Operation != "" {
		if err := validateOperation(e.Operation); err != nil {
			return nil, err
		}
	}
	if e.Attempts < 0 {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w: negative attempts", e.Key, ErrInvalidRequest)
	}
	rec, err := j.sanitize(e)
	if err != nil {
		return nil, err
	}
	// Encoding outside the lock keeps the critical section, which every
	// concurrent writer waits on, to a copy.
	bp := fjEncodeBufs.Get()
	defer fjEncodeBufs.Put(bp)
	encoded, err := fjAppendBegin((*bp)[:0], rec)
	*bp = encoded
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
	}

	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		j.mu.Lock()
		if err := j.writableLocked(); err != nil {
			j.mu.Unlock()
			return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
		}
		found := j.lookupLocked(rec.Operation, rec.Key)
		if found == nil && !j.cur.empty() && len(j.cur.buf)+len(encoded) > fjMaxBatch {
			// A batch must stay within what replay accepts: wait for the
			// committer to take this one.
			j.wake()
			j.idle.Wait()
			j.mu.Unlock()
			continue
		}
		if found == nil {
			b := j.appendBeginLocked(rec, encoded)
			j.mu.Unlock()
			<-b.done
			if b.err != nil {
				return nil, fmt.Errorf("idemhttp: journal begin %s: %w", rec.Key, b.err)
			}
			return nil, nil
		}
		if b := found.batch; b != nil {
			// Stored by a Begin whose batch is not on disk yet: its
			// outcome decides.
			j.mu.Unlock()
			select {
			case <-b.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		}
		key := found.key
		j.mu.Unlock()
		existing, err := j.read(key)
		if errors.Is(err, ErrNotFound) {
			continue // deleted in between: look again
		}
		if err != nil {
			return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
		}
		return existing, nil
	}
}

// fjEncodeBufs holds encoding buffers, so that a Begin allocates none.
var fjEncodeBufs = &fjBufs{}

// lookupLocked returns the entry for operation (when not empty) or, failing
// that, for key.
func (j *FileJournal) lookupLocked(operation, key string) *fjEntry {
	if operation != "" {
		if k, ok := j.byOp[operation]; ok {
			return j.byKey[k]
		}
	}
	return j.byKey[key]
}

// appendBeginLocked adds the encoded begin record of rec to the current
// batch and indexes its entry, reserved until the batch is durable.
func (j *FileJournal) appendBeginLocked(rec *Entry, encoded []byte) *fjBatch {
	b := j.cur
	le := &fjEntry{
		key: rec.Key, operation: rec.Operation, created: rec.Created, updated: rec.Updated,
		attempts: rec.Attempts, lastStatus: rec.LastStatus, state: journalStatePending,
		off: b.off + int64(len(b.buf)), size: int32(len(encoded)), batch: b,
	}
	j.appendLocked(encoded, 1)
	b.begins = append(b.begins, le)
	j.byKey[le.key] = le
	j.pending++
	if le.operation != "" {
		j.byOp[le.operation] = le.key
	}
	j.live += int64(len(encoded)) + fjEntryOverhead
	return b
}

// Finish implements [Journal.Finish]: it adds o.Attempts to the entry's
// attempts and sets its state, last status and Updated time (o.At, or now
// when zero). o.State must be one of the three states; a call that ended
// without a definite outcome records [StatePending] again. Finish returns
// an error wrapping [ErrNotFound] for an unknown key.
//
// The new state is visible at once to this journal's readers; its record
// is written behind (see [FileJournal]). Finish does not wait for the disk,
// so ctx is only checked on entry.
func (j *FileJournal) Finish(ctx context.Context, key string, o Outcome) error {
	state, ok := journalStateByte(o.State)
	if !ok {
		return fmt.Errorf("idemhttp: journal finish %s: %w: unknown state %q", key, ErrInvalidRequest, o.State)
	}
	if o.Attempts < 0 {
		return fmt.Errorf("idemhttp: journal finish %s: %w: negative attempts", key, ErrInvalidRequest)
	}
	at := o.At
	if at.IsZero() {
		at = time.Now()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.writableLocked(); err != nil {
		return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
	}
	le, ok := j.byKey[key]
	if !ok || le.deleting {
		return fmt.Errorf("idemhttp: journal finish %s: %w", key, ErrNotFound)
	}
	// Attempts are stored as a total: see the finish record's format.
	if was, now := le.state == journalStatePending, state == journalStatePending; was != now {
		if now {
			j.pending++
		} else {
			j.pending--
		}
	}
	le.state, le.lastStatus, le.updated = state, o.Status, at
	le.attempts += o.Attempts
	j.appendFinishLocked(le)
	return nil
}

// appendFinishLocked appends a finish record with le's current values.
func (j *FileJournal) appendFinishLocked(le *fjEntry) {
	b := j.cur
	n := len(b.buf)
	b.buf = fjAppendFinish(b.buf, le.key, le.state, le.lastStatus, le.attempts, le.updated)
	j.appended(n, 1)
}

// Get implements [Journal.Get]. An entry whose Begin is not yet durable
// is not found.
func (j *FileJournal) Get(ctx context.Context, key string) (*Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e, err := j.read(key)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal get %s: %w", key, err)
	}
	return e, nil
}

// read returns the durable entry for key, its request read back from the
// file and checked.
func (j *FileJournal) read(key string) (*Entry, error) {
	if err := j.lockToRead(); err != nil {
		return nil, err
	}
	defer j.fileMu.RUnlock()
	le, ok := j.byKey[key]
	if !ok || le.batch != nil {
		j.mu.Unlock()
		return nil, ErrNotFound
	}
	snap := *le
	j.mu.Unlock()
	return j.readEntry(&snap, nil)
}

// lockToRead takes fileMu shared, so that the file is not replaced while
// entries are read back from it, then mu, to look them up in the index.
// The caller unlocks mu once it has what it needs from the index, and
// fileMu once it is done reading. After Close it takes neither and
// returns ErrJournalClosed.
func (j *FileJournal) lockToRead() error {
	j.fileMu.RLock()
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		j.fileMu.RUnlock()
		return ErrJournalClosed
	}
	return nil
}

// readEntry reads le's begin record into an Entry with le's state, using
// buf for the read if it is large enough. Called with fileMu held.
func (j *FileJournal) readEntry(le *fjEntry, buf []byte) (*Entry, error) {
	if cap(buf) < int(le.size) {
		buf = make([]byte, le.size)
	}
	buf = buf[:le.size]
	if _, err := j.f.ReadAt(buf, le.off); err != nil {
		return nil, fmt.Errorf("read entry %s: %w", le.key, err)
	}
	payload, _, ok := fjReadRecord(buf)
	if !ok {
		return nil, fmt.Errorf("%w: entry %s: the record at offset %d fails its checksum", ErrJournalCorrupt, le.key, le.off)
	}
	rec, err := fjDecodeRecord(payload)
	if err != nil {
		return nil, fmt.Errorf("entry %s: %w", le.key, err)
	}
	if rec.kind != fjKindBegin || rec.key != le.key {
		return nil, fmt.Errorf("%w: entry %s: the record at offset %d is not its own", ErrJournalCorrupt, le.key, le.off)
	}
	e := rec.entry()
	e.State, e.Updated, e.Attempts, e.LastStatus = journalStateOf(le.state), le.updated, le.attempts, le.lastStatus
	return e, nil
}

// Pending implements [Journal.Pending]: entries in state pending, oldest
// Created first (ties in key order).
func (j *FileJournal) Pending(ctx context.Context) ([]*Entry, error) {
	out, err := j.list(ctx, func(le *fjEntry) bool { return le.state == journalStatePending })
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal pending: %w", err)
	}
	return out, nil
}

// Entries returns every entry in the journal, whatever its state, oldest
// Created first (ties in key order). It is meant for inspection tools; it
// reads every entry's request back from the file. A damaged entry gives an
// error wrapping [ErrJournalCorrupt] that names its key.
func (j *FileJournal) Entries(ctx context.Context) ([]*Entry, error) {
	out, err := j.list(ctx, func(*fjEntry) bool { return true })
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal entries: %w", err)
	}
	return out, nil
}

// list returns the durable entries that keep selects, oldest first.
func (j *FileJournal) list(ctx context.Context, keep func(*fjEntry) bool) ([]*Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := j.lockToRead(); err != nil {
		return nil, err
	}
	defer j.fileMu.RUnlock()
	var snaps []fjEntry
	for _, le := range j.byKey {
		if le.batch == nil && !le.deleting && keep(le) {
			snaps = append(snaps, *le)
		}
	}
	j.mu.Unlock()
	slices.SortFunc(snaps, func(a, b fjEntry) int {
		return cmp.Or(a.created.Compare(b.created), strings.Compare(a.key, b.key))
	})
	out := make([]*Entry, 0, len(snaps))
	var buf []byte
	for i := range snaps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		e, err := j.readEntry(&snaps[i], buf)
		if err != nil {
			return nil, err
		}
		buf = buf[:0]
		out = append(out, e)
	}
	return out, nil
}

// Prune implements [Journal.Prune]: it deletes the done entries updated
// before cutoff with one delete record each, in one group commit, and
// then compacts the file if that would halve it (see [FileJournal.Compact]).
// A failed compaction is not Prune's error: the file stays as it was and
// the next Prune tries again.
func (j *FileJournal) Prune(ctx context.Context, cutoff time.Time) (int, error) {
	n, err := j.remove(ctx, func(le *fjEntry) bool {
		return le.state == journalStateDone && le.updated.Before(cutoff)
	})
	if err != nil {
		return 0, fmt.Errorf("idemhttp: journal prune: %w", err)
	}
	if n > 0 {
		// Best effort: a failed compaction leaves the file as it was, a
		// valid journal, and the next Prune tries again. Prune's own work
		// is done and durable.
		_ = j.maybeCompact(ctx)
	}
	return n, nil
}

// Delete removes the entry for key, whatever its state, durably. It
// returns an error wrapping [ErrNotFound] for an unknown key.
//
// Deleting a pending entry forgets an operation whose outcome is unknown:
// rerunning it mints a new key and may run it twice.
func (j *FileJournal) Delete(ctx context.Context, key string) error {
	n, err := j.remove(ctx, func(le *fjEntry) bool { return le.key == key })
	if err == nil && n == 0 {
		err = ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("idemhttp: journal delete %s: %w", key, err)
	}
	return nil
}

// remove appends a delete record for every durable entry that doomed
// selects, waits for them to be on disk, and drops the entries from the
// index.
func (j *FileJournal) remove(ctx context.Context, doomed func(*fjEntry) bool) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	j.mu.Lock()
	if err := j.writableLocked(); err != nil {
		j.mu.Unlock()
		return 0, err
	}
	var les []*fjEntry
	for _, le := range j.byKey {
		if le.batch == nil && !le.deleting && doomed(le) {
			les = append(les, le)
		}
	}
	if len(les) == 0 {
		j.mu.Unlock()
		return 0, nil
	}
	b := j.cur
	n := len(b.buf)
	for _, le := range les {
		le.deleting = true
		b.buf = fjAppendDelete(b.buf, le.key)
	}
	b.deletes = append(b.deletes, les...)
	j.appended(n, len(les))
	j.mu.Unlock()
	<-b.done
	if b.err != nil {
		return 0, b.err
	}
	return len(les), nil
}

// Verify reads the whole file again and reports the first problem as an
// error wrapping [ErrJournalCorrupt]: a batch or record that fails its
// checksum, a record that does not decode, a record about an entry that
// does not exist, or an entry the file and the index disagree on.
func (j *FileJournal) Verify(ctx context.Context) error {
	if err := j.verify(ctx); err != nil {
		return fmt.Errorf("idemhttp: journal verify: %w", err)
	}
	return nil
}
