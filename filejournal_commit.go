package idemhttp

import (
	"fmt"
	"runtime"
)

// fjBatch is a group of records written and made durable together (one
// group commit).
type fjBatch struct {
	off     int64      // where the batch goes in the file
	buf     []byte     // batch header space, then the records
	begins  []*fjEntry // entries this batch stores
	deletes []*fjEntry // entries this batch deletes
	done    chan struct{}
	err     error // set before done is closed
}

func (b *fjBatch) empty() bool { return len(b.buf) == fjBatchHdrLen }

// newBatchLocked starts the batch that follows the file's end at off.
func (j *FileJournal) newBatchLocked(off int64) *fjBatch {
	buf := fjBatchBufs.Get()
	return &fjBatch{off: off, buf: (*buf)[:fjBatchHdrLen], done: make(chan struct{})}
}

// fjBatchBufs recycles batch buffers: under load every batch holds tens of
// request bodies, and growing a fresh buffer for each was most of the
// journal's allocation.
var fjBatchBufs = &fjBufs{}

// appended accounts for records just added to the current batch at buf
// offset from, and wakes the committer if the batch was empty. Called
// with mu held.
func (j *FileJournal) appended(from, records int) {
	j.writes.Add(uint64(records))
	if from == fjBatchHdrLen {
		j.wake()
	}
}

// appendLocked adds encoded records to the current batch.
func (j *FileJournal) appendLocked(encoded []byte, records int) {
	b := j.cur
	n := len(b.buf)
	b.buf = append(b.buf, encoded...)
	j.appended(n, records)
}

// wake makes sure the committer looks at the current batch.
func (j *FileJournal) wake() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// commitLoop is the journal's one writer. It seals the current batch as
// soon as it holds a record and the previous one is on disk, so a lone
// caller pays one synchronous write, and under load each one
// carries every record that arrived while the previous one ran. It runs
// from OpenFileJournal until Close, which it answers by writing what is
// left.
func (j *FileJournal) commitLoop() {
	defer close(j.loopDone)
	for {
		select {
		case <-j.kick:
			// Callers that are runnable join the batch before it is
			// sealed: a yield, no timer, and for a lone caller it returns
			// at once. Without it, with one processor (GOMAXPROCS=1, a
			// one-CPU container), the kick makes this goroutine the next
			// to run, it seals each caller's record alone, and the
			// callers behind it never share a commit.
			runtime.Gosched()
			for j.commitOne() {
			}
		case <-j.stop:
			for j.commitOne() {
			}
			return
		}
	}
}

// commitOne writes and syncs the current batch, if it holds anything,
// and reports whether it did.
//
// Durability order: the batch is written and synced while fileMu is held
// shared (compaction, which replaces the file, waits), then its entries
// are published in the index, and only then are its callers woken. The
// next batch is written only after this one's sync returned, which is
// what lets OpenFileJournal tell a torn tail from damage.
func (j *FileJournal) commitOne() bool {
	j.fileMu.RLock()
	j.mu.Lock()
	b := j.cur
	if b.empty() {
		j.mu.Unlock()
		j.fileMu.RUnlock()
		return false
	}
	j.cur = j.newBatchLocked(b.off + int64(len(b.buf)))
	j.inflight = b
	err := j.broken
	seq, salt := j.seq+1, j.salt
	j.mu.Unlock()

	if err == nil {
		fjSealBatch(b.buf, seq, b.off, salt)
		if err = j.step("write"); err == nil {
			_, err = j.f.WriteAt(b.buf, b.off)
		}
		if err == nil {
			if err = j.step("sync"); err == nil && fjSyncFlag == 0 {
				err = fjDatasync(j.f)
			}
		}
		if err == nil {
			j.commits.Add(1)
		} else {
			// The callers are told this batch failed, so it must not
			// come back when the file is next opened, as it would if
			// the write reached the page cache: cut it off. If even
			// that fails, the next open may find it whole.
			if terr := j.f.Truncate(b.off); terr == nil {
				_ = fjDatasync(j.f)
			}
			err = fmt.Errorf("journal writes stopped: %w", err)
		}
	}

	j.mu.Lock()
	b.err = err
	if err != nil {
		// The file's tail is unknown now (a failed fdatasync may have
		// dropped dirty pages), so no later record may depend on it.
		if j.broken == nil {
			j.broken = err
		}
		for _, le := range b.begins {
			if j.byKey[le.key] == le {
				j.unindexLocked(le)
			}
		}
		for _, le := range b.deletes {
			le.deleting = false
		}
	} else {
		j.seq = seq
		j.size.Store(b.off + int64(len(b.buf)))
		for _, le := range b.begins {
			le.batch = nil
		}
		for _, le := range b.deletes {
			if j.byKey[le.key] == le {
				j.unindexLocked(le)
			}
		}
	}
	j.inflight = nil
	j.idle.Broadcast()
	j.mu.Unlock()
	j.fileMu.RUnlock()

	buf := b.buf
	b.buf = nil
	fjBatchBufs.Put(&buf)
	close(b.done)
	return true
}

// unindexLocked drops le from the index.
func (j *FileJournal) unindexLocked(le *fjEntry) {
	delete(j.byKey, le.key)
	if le.state == journalStatePending {
		j.pending--
	}
	if le.operation != "" && j.byOp[le.operation] == le.key {
		delete(j.byOp, le.operation)
	}
	j.live -= int64(le.size) + fjEntryOverhead
}

// step runs the test fault hook for a commit step, if one is set.
func (j *FileJournal) step(name string) error {
	if j.fault == nil {
		return nil
	}
	return j.fault(name)
}
