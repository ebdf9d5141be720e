package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// journalLockTimeout bounds how long OpenFileJournal waits for another
// holder of the file lock. bbolt's default of 0 waits forever, which would
// turn a second batch process started by mistake into a silent hang.
const journalLockTimeout = 100 * time.Millisecond

// JournalOptions configures [OpenFileJournal]. A nil *JournalOptions and
// the zero value both mean the defaults: bodies stored, the standard
// credentials withheld, the file verified on open.
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

	// SkipVerify skips the check of every entry's checksum and of the
	// indexes that OpenFileJournal runs by default, which reads the whole
	// file (about 0.3 s per 100 000 entries with the file in the page
	// cache). Damage is then found by the first read that meets it. Use it
	// to open a damaged journal for inspection and repair (Entries,
	// Delete), or when opening a very large journal must be fast.
	SkipVerify bool
}

// JournalStats counts a [FileJournal]'s writes since it was opened.
type JournalStats struct {
	// Writes is the number of write operations (Begin, Finish, Delete,
	// Prune) that ran inside a write transaction.
	Writes uint64

	// Commits is the number of write transactions committed: the syncs.
	// Each is one bbolt commit, which returns only after its data pages and
	// then its meta page are on disk (two fdatasync calls). Writes that
	// changed nothing (a Begin that found its entry) commit nothing.
	// Commits divided by Writes falls below one when group commit merges
	// concurrent writes.
	Commits uint64
}

// FileJournal is the embedded [Journal]: one file, written through
// go.etcd.io/bbolt with ACID transactions, mode 0600, and locked so that
// only one FileJournal at a time (in any process) has it open.
//
// Every write is on disk before the method returns (write, sync, publish:
// bbolt writes the pages, syncs them, writes and syncs its meta page, and
// only then does the caller see success). Concurrent writes share one
// transaction and its syncs (group commit), so under load durability costs
// a fraction of a sync per request, and a lone caller never waits for
// company.
//
// Entries never hold the Authorization, Cookie or Proxy-Authorization
// headers, nor any header in [JournalOptions.SecretHeaders], nor a URL
// password, whatever the caller passes: the journal is the last line of
// defence for secrets at rest.
//
// A write honours its context while it waits for an earlier commit; once
// it is part of a commit its result is final, whatever the context does,
// since giving up then could report failure for a write that is on disk.
//
// Damage to the file is reported as an error wrapping [ErrJournalCorrupt],
// never as a panic. A FileJournal is safe for concurrent use. Open one with
// [OpenFileJournal]; the zero value is not usable. Close it when done.
type FileJournal struct {
	db         *bolt.DB
	omitBodies bool
	secret     map[string]bool // canonical header names never stored

	mu         sync.Mutex
	idle       sync.Cond    // signalled when committing turns false
	queue      []*journalOp // writes waiting for the next batch
	committing bool         // a leader is running a batch
	closed     bool         // Close was called; no new writes
	broken     error        // set after bbolt panicked in a write; every later write fails with it

	writes  atomic.Uint64
	commits atomic.Uint64
}

var _ Journal = (*FileJournal)(nil)

// OpenFileJournal opens the journal file at path, creating it (mode 0600)
// if it does not exist or is empty. An existing file that others may read
// or write is tightened to mode 0600. A nil opts means the defaults.
//
// If another FileJournal, in this process or another, has the file open,
// OpenFileJournal fails within about 100 ms with an error wrapping
// [ErrJournalLocked]. A file that is not a journal, or is truncated or
// damaged, gives an error wrapping [ErrJournalCorrupt]; unless
// opts.SkipVerify is set, every entry's checksum and the indexes are
// checked before OpenFileJournal returns, which reads the whole file.
func OpenFileJournal(path string, opts *JournalOptions) (*FileJournal, error) {
	if opts == nil {
		opts = &JournalOptions{}
	}
	j := &FileJournal{
		omitBodies: opts.OmitBodies,
		secret: map[string]bool{
			"Authorization":       true,
			"Cookie":              true,
			"Proxy-Authorization": true,
		},
	}
	for _, name := range opts.SecretHeaders {
		j.secret[http.CanonicalHeaderKey(name)] = true
	}
	j.idle.L = &j.mu

	db, err := journalOpenBolt(path)
	if err != nil {
		return nil, err
	}
	j.db = db
	if err := j.init(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, err)
	}
	if !opts.SkipVerify {
		ctx := context.Background()
		if err := j.view(ctx, func(tx *bolt.Tx) error { return journalVerify(ctx, tx) }); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, err)
		}
	}
	return j, nil
}

// journalOpenBolt opens the bbolt file, turning bbolt's errors and panics
// into ErrJournalLocked and ErrJournalCorrupt.
func journalOpenBolt(path string) (*bolt.DB, error) {
	// bbolt opens the file through this hook, so that if it panics on a
	// damaged file before returning a DB, the descriptor (and with it the
	// lock) can still be released.
	var file *os.File
	open := func(name string, flag int, mode os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, mode)
		file = f
		return f, err
	}
	var db *bolt.DB
	panicked, err := journalProtect(func() (err error) {
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: journalLockTimeout, OpenFile: open})
		return err
	})
	switch {
	case panicked:
		if file != nil {
			_ = file.Close()
		}
		return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, err)
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, ErrJournalLocked)
	case err == nil:
	case journalIsOSError(err):
		return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, err)
	default:
		// Not the system's refusal, so bbolt's verdict on the contents:
		// ErrInvalid, ErrChecksum, ErrVersionMismatch, or unexported errors
		// such as a file shorter than its two meta pages.
		return nil, fmt.Errorf("idemhttp: open journal %s: %w: %w", path, ErrJournalCorrupt, err)
	}
	// bbolt creates the file with mode 0600, but an existing file may have
	// been created looser (a copy, a restore): tighten it, since entries
	// hold request bodies.
	if fi, err := file.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := file.Chmod(0o600); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("idemhttp: open journal %s: %w", path, err)
		}
	}
	return db, nil
}

// journalIsOSError reports whether err came from the operating system
// (permissions, I/O, memory) rather than from what bbolt read in the file.
func journalIsOSError(err error) bool {
	var errno syscall.Errno
	var pathErr *fs.PathError
	return errors.As(err, &errno) || errors.As(err, &pathErr)
}

// init checks that the file is as long as its meta page says (a truncated
// file would fault when a page past the end is touched) and that it holds
// a journal of this build's format, and creates the buckets of a new
// journal.
func (j *FileJournal) init() error {
	empty := false
	err := j.view(context.Background(), func(tx *bolt.Tx) error {
		fi, err := os.Stat(j.db.Path())
		if err != nil {
			return err
		}
		if fi.Size() < tx.Size() {
			return fmt.Errorf("%w: file is %d bytes, its pages reach %d: truncated", ErrJournalCorrupt, fi.Size(), tx.Size())
		}
		if k, _ := tx.Cursor().First(); k == nil {
			empty = true
			return nil
		}
		if err := journalCheckVersion(tx); err != nil {
			return err
		}
		_, err = journalBuckets(tx)
		return err
	})
	if err != nil || !empty {
		return err
	}
	// Only a new journal lacks buckets, so only the first open pays this
	// commit.
	return j.guard(func() error {
		return j.db.Update(func(tx *bolt.Tx) error {
			for _, name := range journalBucketNames {
				if _, err := tx.CreateBucket(name); err != nil {
					return err
				}
			}
			return tx.Bucket(journalMeta).Put(journalVersionKey, []byte{journalVersion})
		})
	})
}

// Close waits for writes in progress, then closes the file and releases its
// lock. Later calls on the journal return [ErrJournalClosed]. Close is
// idempotent.
func (j *FileJournal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	for j.committing {
		j.idle.Wait()
	}
	j.mu.Unlock()
	// bbolt's Close waits for open read transactions.
	if err := j.db.Close(); err != nil {
		return fmt.Errorf("idemhttp: close journal: %w", err)
	}
	return nil
}

// Stats returns the journal's write counters since it was opened.
func (j *FileJournal) Stats() JournalStats {
	return JournalStats{Writes: j.writes.Load(), Commits: j.commits.Load()}
}

// Begin implements [Journal.Begin]. The operation id is looked up first,
// then the key: when both exist on different entries, the operation's entry
// is returned. The entry stored is a sanitised copy of e: state pending,
// Created (and Updated) set to now when zero, secret headers, URL password
// and (with OmitBodies) the body removed. e is not modified. Begin fails
// with an error wrapping [ErrInvalidKey] or [ErrInvalidRequest] for a bad
// key or operation id, before touching the file.
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
	// Encoding outside the transaction keeps the batch, which every
	// concurrent writer waits on, as short as possible.
	stateVal, requestVal, err := journalEncodeEntry(rec)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
	}
	if len(requestVal) > bolt.MaxValueSize {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w: entry of %d bytes is too large", e.Key, ErrInvalidRequest, len(requestVal))
	}
	key := []byte(rec.Key)
	operation := []byte(rec.Operation)
	pendingKey := journalTimeKey(rec.Created, key)

	var existing *Entry
	err = j.submit(ctx, func(tx *bolt.Tx, op *journalOp) error {
		existing = nil // a batch may run more than once
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		if len(operation) > 0 {
			if k := b.ops.Get(operation); k != nil {
				existing, err = b.get(k)
				if errors.Is(err, ErrNotFound) {
					return fmt.Errorf("%w: operation %q maps to missing entry %q", ErrJournalCorrupt, operation, k)
				}
				return err
			}
		}
		if b.keys.Get(key) != nil {
			existing, err = b.get(key)
			return err
		}
		op.changed = true
		n, err := b.requests.NextSequence()
		if err != nil {
			return err
		}
		seq := journalSeqKey(n)
		// Only a damaged sequence (it is stored in the file too) could
		// hand out a number in use, and writing there would overwrite
		// another entry. States and requests are written together, so
		// one lookup tells.
		if b.states.Get(seq) != nil {
			return fmt.Errorf("%w: sequence number %d is already in use", ErrJournalCorrupt, n)
		}
		for _, p := range []struct {
			bucket   *bolt.Bucket
			key, val []byte
		}{{b.requests, seq, requestVal}, {b.states, seq, stateVal}, {b.keys, key, seq}, {b.pending, pendingKey, seq}} {
			if err := p.bucket.Put(p.key, p.val); err != nil {
				return err
			}
		}
		if len(operation) > 0 {
			return b.ops.Put(operation, key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w", rec.Key, err)
	}
	return existing, nil
}

// Finish implements [Journal.Finish]: it adds o.Attempts to the entry's
// attempts and sets its state, last status and Updated time (o.At, or now
// when zero). o.State must be one of the three states; a call that ended
// without a definite outcome records [StatePending] again. Finish returns
// an error wrapping [ErrNotFound] for an unknown key.
func (j *FileJournal) Finish(ctx context.Context, key string, o Outcome) error {
	if _, ok := journalStateByte(o.State); !ok {
		return fmt.Errorf("idemhttp: journal finish %s: %w: unknown state %q", key, ErrInvalidRequest, o.State)
	}
	if o.Attempts < 0 {
		return fmt.Errorf("idemhttp: journal finish %s: %w: negative attempts", key, ErrInvalidRequest)
	}
	at := o.At
	if at.IsZero() {
		at = time.Now()
	}
	state, _ := journalStateByte(o.State)
	k := []byte(key)
	err := j.submit(ctx, func(tx *bolt.Tx, op *journalOp) error {
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		seq, err := b.seqOf(k)
		if err != nil {
			return err
		}
		prev, err := b.state(seq, k)
		if err != nil {
			return err
		}
		// Only the state record changes: its head (key, operation,
		// fingerprint) is copied as it is, the request is not read.
		next := prev
		next.state, next.updated, next.lastStatus = o.State, at, o.Status
		next.attempts += o.Attempts
		val := make([]byte, 0, len(prev.head)+journalStateTailMax+journalCRCLen)
		val = journalAppendStateTail(append(val, prev.head...), state, next.created, next.updated, next.attempts, next.lastStatus)
		// seq aliases the file, or a page this transaction rewrites.
		seq = bytes.Clone(seq)
		op.changed = true
		if err := b.states.Put(seq, val); err != nil {
			return err
		}
		return b.reindex(k, seq, &prev, &next)
	})
	if err != nil {
		return fmt.Errorf("idemhttp: journal finish %s: %w", key, err)
	}
	return nil
}

// Get implements [Journal.Get].
func (j *FileJournal) Get(ctx context.Context, key string) (*Entry, error) {
	var e *Entry
	err := j.view(ctx, func(tx *bolt.Tx) error {
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		e, err = b.get([]byte(key))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal get %s: %w", key, err)
	}
	return e, nil
}

// Pending implements [Journal.Pending]: entries in state pending, oldest
// Created first (ties in key order). It reads only the pending entries,
// however many done entries the journal keeps.
func (j *FileJournal) Pending(ctx context.Context) ([]*Entry, error) {
	var out []*Entry
	err := j.view(ctx, func(tx *bolt.Tx) error {
		out = nil
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		c := b.pending.Cursor()
		for k, seq := c.First(); k != nil; k, seq = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := b.indexed(k, seq, StatePending)
			if err != nil {
				return err
			}
			e, err := b.withRequest(seq, &s)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal pending: %w", err)
	}
	return out, nil
}

// Prune implements [Journal.Prune]. It reads only the done entries it
// deletes, however many entries the journal holds, and deletes them in
// transactions of at most 1000 entries, so that a large prune does not
// hold up concurrent writers for long. If ctx ends between transactions,
// Prune returns the count deleted so far with ctx's error.
func (j *FileJournal) Prune(ctx context.Context, cutoff time.Time) (int, error) {
	total := 0
	for {
		n, err := j.pruneChunk(ctx, cutoff)
		total += n
		if err != nil {
			return total, fmt.Errorf("idemhttp: journal prune: %w", err)
		}
		if n < journalPruneChunk {
			return total, nil
		}
	}
}

// journalPruneChunk bounds the entries one Prune transaction deletes: a
// group commit runs every waiting writer's op in one transaction, so a
// long op delays them all. 1000 deletions take about 10 ms on a small VM.
const journalPruneChunk = 1000

// pruneChunk deletes up to journalPruneChunk done entries updated before
// cutoff.
func (j *FileJournal) pruneChunk(ctx context.Context, cutoff time.Time) (int, error) {
	limit := journalTimeKey(cutoff, nil)
	var n int
	err := j.submit(ctx, func(tx *bolt.Tx, op *journalOp) error {
		n = 0
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		// Collect first: deleting under a bbolt cursor skips elements. And
		// decoding everything before the first delete means a damaged
		// entry fails the op with the transaction untouched. Only state
		// records are read: a pruned entry's request is deleted unread.
		type doomed struct {
			seq []byte
			s   journalState
		}
		var all []doomed
		c := b.done.Cursor()
		for k, seq := c.First(); k != nil && len(all) < journalPruneChunk && bytes.Compare(k[:min(len(k), journalTimeKeyLen)], limit) < 0; k, seq = c.Next() {
			s, err := b.indexed(k, seq, StateDone)
			if err != nil {
				return err
			}
			all = append(all, doomed{seq, s})
		}
		if len(all) == 0 {
			return nil
		}
		op.changed = true
		for i := range all {
			if err := b.remove(all[i].seq, &all[i].s); err != nil {
				return err
			}
		}
		n = len(all)
		return nil
	})
	return n, err
}

// Entries returns every entry in the journal, whatever its state, oldest
// Created first (ties in key order). It is meant for inspection tools; it
// reads the whole file. A damaged entry gives an error wrapping
// [ErrJournalCorrupt] that names its key.
func (j *FileJournal) Entries(ctx context.Context) ([]*Entry, error) {
	var out []*Entry
	err := j.view(ctx, func(tx *bolt.Tx) error {
		out = nil
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		return b.states.ForEach(func(seq, v []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			s, err := journalDecodeState(v)
			if err != nil {
				return fmt.Errorf("entry %s: %w", b.nameOf(seq), err)
			}
			e, err := b.withRequest(seq, &s)
			if err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal entries: %w", err)
	}
	slices.SortFunc(out, func(a, b *Entry) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out, nil
}

// Delete removes the entry for key, whatever its state, with its index
// records, durably. It returns an error wrapping [ErrNotFound] for an
// unknown key. A damaged entry can be deleted too: its index records are
// then found by scanning, so that inspection tools can repair a journal
// opened with [JournalOptions.SkipVerify].
//
// Deleting a pending entry forgets an operation whose outcome is unknown:
// rerunning it mints a new key and may run it twice.
func (j *FileJournal) Delete(ctx context.Context, key string) error {
	k := []byte(key)
	err := j.submit(ctx, func(tx *bolt.Tx, op *journalOp) error {
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		seq, err := b.seqOf(k)
		if errors.Is(err, ErrJournalCorrupt) {
			op.changed = true
			return b.removeDamaged(k, nil)
		}
		if err != nil {
			return err
		}
		// Only the state record is read: an entry whose request record is
		// damaged is deleted like any other.
		s, err := b.state(seq, k)
		if errors.Is(err, ErrJournalCorrupt) {
			op.changed = true
			return b.removeDamaged(k, seq)
		}
		if err != nil {
			return err
		}
		op.changed = true
		return b.remove(seq, &s)
	})
	if err != nil {
		return fmt.Errorf("idemhttp: journal delete %s: %w", key, err)
	}
	return nil
}

// Verify reads every entry and index record and reports the first problem
// as an error wrapping [ErrJournalCorrupt]: a bad checksum, an entry stored
// under another key, keys out of order, an index record pointing nowhere or
// disagreeing with its entry, an entry missing from its index.
// [OpenFileJournal] runs it unless [JournalOptions.SkipVerify] is set.
func (j *FileJournal) Verify(ctx context.Context) error {
	if err := j.view(ctx, func(tx *bolt.Tx) error { return journalVerify(ctx, tx) }); err != nil {
		return fmt.Errorf("idemhttp: journal verify: %w", err)
	}
	return nil
}
