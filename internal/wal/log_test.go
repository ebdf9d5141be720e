package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// collect is an ApplyFunc that keeps every record it is given.
type collect struct {
	payloads []string
	offs     []int64
	sizes    []int
}

func (c *collect) apply(off int64, n int, p []byte) error {
	c.payloads = append(c.payloads, string(p))
	c.offs = append(c.offs, off)
	c.sizes = append(c.sizes, n)
	return nil
}

// appendRecord appends one record holding payload and waits for it.
func appendRecord(t *testing.T, l *Log, payload string) {
	t.Helper()
	b, _, err := l.Append(RecordHeaderLen+len(payload), 1, func(buf []byte) []byte {
		return AppendRecord(buf, []byte(payload))
	})
	require.NoError(t, err)
	<-b.Done()
	require.NoError(t, b.Err())
}

// appendNoWait appends one record holding payload and returns its batch
// without waiting for it.
func appendNoWait(t *testing.T, l *Log, payload string) *Batch {
	t.Helper()
	b, _, err := l.Append(RecordHeaderLen+len(payload), 1, func(buf []byte) []byte {
		return AppendRecord(buf, []byte(payload))
	})
	require.NoError(t, err)
	return b
}

// logPath is the path of a new log in a directory of its own.
func logPath(t *testing.T) string { return filepath.Join(t.TempDir(), "log") }

// readUsed returns the log file at path without the zeros preallocated
// after its last batch (see tailFor): what tests that cut, extend or
// compare files work on. It replays the file to find where its batches
// end, and returns the file whole if it does not replay.
func readUsed(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	res, err := Replay(bytes.NewReader(raw), int64(len(raw)), false, func(int64, int, []byte) error { return nil })
	if err != nil || res.Truncated > 0 {
		return raw
	}
	return raw[:res.End]
}

// openLog opens the log at path; it is closed when the test ends.
func openLog(t *testing.T, path string, opts *Options) *Log {
	t.Helper()
	l, err := Open(path, opts, (&collect{}).apply)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// replayFile replays the file at path as it is now, as a crash at this
// instant would leave it, and returns what replay found and the payloads.
func replayFile(t *testing.T, path string) (*Replayed, []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	res, c, err := replayBytes(data, false)
	require.NoError(t, err)
	return res, c.payloads
}

// gate is a Fault hook that holds a step each time it is reached, until
// the test says what the step returns: entered receives the step's name,
// proceed the step's result. release lets every step through from then
// on, so that a failed test does not leave the committer stuck (register
// it with t.Cleanup after the log's Close, so that it runs first).
type gate struct {
	step    string
	entered chan string
	proceed chan error
	done    chan struct{}
	release func()
}

func newGate(step string) *gate {
	g := &gate{step: step, entered: make(chan string), proceed: make(chan error), done: make(chan struct{})}
	g.release = sync.OnceFunc(func() { close(g.done) })
	return g
}

func (g *gate) hook(s string) error {
	if s != g.step {
		return nil
	}
	select {
	case g.entered <- s:
	case <-g.done:
		return nil
	}
	select {
	case err := <-g.proceed:
		return err
	case <-g.done:
		return nil
	}
}

// A batch never grows past MaxBatch, which replay would refuse: Append
// hands the batch being filled back with ErrBatchFull, without calling
// fn, when the records would take it past the bound, and the caller
// waits for it and tries again. A batch holding nothing takes what it is
// given: a single call's records are the caller's to bound. Checked to
// fail with the bound removed from Append.
func TestLogAppendBatchFull(t *testing.T) {
	path := logPath(t)
	g := newGate("write")
	l := openLog(t, path, &Options{Fault: g.hook})
	t.Cleanup(g.release)
	appendNoWait(t, l, "Bfirst")
	<-g.entered // the first batch is being written: the next one fills
	second := appendNoWait(t, l, "Bsecond")
	used := BatchHeaderLen + len(rec("Bsecond"))

	called := false
	full, _, err := l.Append(MaxBatch-used+1, 1, func(buf []byte) []byte {
		called = true
		return buf
	})
	assert.ErrorIs(t, err, ErrBatchFull)
	assert.Same(t, second, full, "the batch to wait for")
	assert.False(t, called, "fn is not called for a full batch")

	atLimit, off, err := l.Append(MaxBatch-used, 1, func(buf []byte) []byte {
		return AppendRecord(buf, []byte("Bthird"))
	})
	require.NoError(t, err, "exactly at the bound")
	assert.Same(t, second, atLimit)
	assert.Equal(t, second.End()-int64(len(rec("Bthird"))), off, "where the record will be")

	g.proceed <- nil // the first batch
	<-g.entered
	g.proceed <- nil // the second
	<-full.Done()
	require.NoError(t, full.Err())

	alone, _, err := l.Append(MaxBatch-used+1, 1, func(buf []byte) []byte {
		return AppendRecord(buf, []byte("Bfourth"))
	})
	require.NoError(t, err, "an empty batch")
	<-g.entered
	g.proceed <- nil
	<-alone.Done()
	require.NoError(t, alone.Err())
	_, got := replayFile(t, path)
	assert.Equal(t, []string{"Bfirst", "Bsecond", "Bthird", "Bfourth"}, got)
}

// The durability order is write, sync, publish, wake: OnCommit sees each
// batch once it is on disk (the log's Size past it) and before anyone
// waiting for it wakes, and a failed batch with its error, also before
// its waiters wake. Checked to fail with OnCommit called after the
// batch's Done is closed.
func TestLogOnCommitBeforeWake(t *testing.T) {
	type commit struct {
		err   error
		woken bool  // Done was already closed
		size  int64 // the log's Size
	}
	var (
		mu      sync.Mutex
		commits = make(map[*Batch]commit)
		l       *Log
		fail    atomic.Bool
	)
	injected := errors.New("injected write failure")
	l = openLog(t, logPath(t), &Options{
		OnCommit: func(b *Batch, err error) {
			var woken bool
			select {
			case <-b.Done():
				woken = true
			default:
			}
			mu.Lock()
			commits[b] = commit{err: err, woken: woken, size: l.Size()}
			mu.Unlock()
		},
		Fault: func(s string) error {
			if s == "write" && fail.Load() {
				return injected
			}
			return nil
		},
	})

	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 5 {
				p := fmt.Sprintf("B%d-%d", w, i)
				b, _, err := l.Append(RecordHeaderLen+len(p), 1, func(buf []byte) []byte {
					return AppendRecord(buf, []byte(p))
				})
				if !assert.NoError(t, err) { // not require: this is not the test's goroutine
					return
				}
				<-b.Done()
				mu.Lock()
				c, ok := commits[b]
				mu.Unlock()
				assert.True(t, ok, "published before its waiter woke")
				assert.False(t, c.woken, "OnCommit ran after its waiters were woken")
				assert.NoError(t, c.err)
				assert.GreaterOrEqual(t, c.size, b.End(), "on disk when published")
			}
		})
	}
	wg.Wait()

	fail.Store(true)
	b := appendNoWait(t, l, "Bfails")
	<-b.Done()
	assert.ErrorIs(t, b.Err(), injected)
	mu.Lock()
	c, ok := commits[b]
	mu.Unlock()
	require.True(t, ok, "a failed batch is published too")
	assert.ErrorIs(t, c.err, injected)
	assert.False(t, c.woken)
	assert.Less(t, c.size, b.End(), "a failed batch is not part of the log")
	assert.ErrorIs(t, l.Close(), injected)
}

// Flush returns once every record appended before it was called is on
// disk: not while the batch holding the last of them is still being
// written, even once the batch before it is done; with ctx's error if
// ctx ends first; and with the error of a write that failed. Checked to
// fail with Flush waiting for the batch in flight rather than the one
// being filled (which one Flush picks races with the first write's
// release, so the check is made over several rounds: one bites).
func TestLogFlush(t *testing.T) {
	path := logPath(t)
	g := newGate("write")
	l := openLog(t, path, &Options{Fault: g.hook})
	t.Cleanup(g.release)
	ctx := context.Background()
	require.NoError(t, l.Flush(ctx), "nothing to flush")

	var want []string
	for round := range 20 {
		first, second := fmt.Sprintf("Bfirst-%d", round), fmt.Sprintf("Bsecond-%d", round)
		want = append(want, first, second)
		appendNoWait(t, l, first)
		<-g.entered
		last := appendNoWait(t, l, second)
		if round == 0 {
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			assert.ErrorIs(t, l.Flush(cancelled), context.Canceled, "Flush waits for the disk")
		}
		flushed := make(chan error, 1)
		go func() { flushed <- l.Flush(ctx) }()
		g.proceed <- nil // the first batch is done
		<-g.entered      // the second is being written
		select {
		case err := <-flushed:
			t.Fatalf("round %d: Flush returned (%v) with the last record appended still being written", round, err)
		default:
		}
		g.proceed <- nil
		require.NoError(t, <-flushed)
		assert.GreaterOrEqual(t, l.Size(), last.End())
	}
	_, got := replayFile(t, path)
	assert.Equal(t, want, got)
	require.NoError(t, l.Flush(ctx), "nothing left to flush")

	injected := errors.New("injected write failure")
	appendNoWait(t, l, "Bthird")
	go func() {
		<-g.entered
		g.proceed <- injected
	}()
	assert.ErrorIs(t, l.Flush(ctx), injected)
	assert.ErrorIs(t, l.Flush(ctx), injected, "writes stay stopped")
	assert.ErrorIs(t, l.Close(), injected)
	assert.ErrorIs(t, l.Flush(ctx), ErrClosed)
}

// Close appends the close marker, alone in its batch, so that the next
// open reports Clean; a journal opened and closed again gains no second
// marker, and one that a crash left (a copy taken before Close) is not
// Clean. A log whose writes stopped writes no marker: its tail is
// unknown. Checked to fail with the marker's write removed from the
// committer.
func TestLogCloseWritesMarker(t *testing.T) {
	path := logPath(t)
	l := openLog(t, path, nil)
	appendRecord(t, l, "Bone")
	crashed := readUsed(t, path)
	require.NoError(t, l.Close())
	raw := readUsed(t, path)
	require.Len(t, raw, len(crashed)+BatchHeaderLen+RecordHeaderLen+closeMarkerLen)
	assert.Equal(t, crashed, raw[:len(crashed)], "Close only appends")
	salt, err := CheckFileHeader(raw)
	require.NoError(t, err)
	seq, records, _, ok := ReadBatch(raw[len(crashed):], int64(len(crashed)), salt)
	require.True(t, ok, "the marker is a valid batch")
	assert.Equal(t, uint64(2), seq)
	nonce, ok := markerNonce(records)
	require.True(t, ok, "the batch is a marker")
	assert.Equal(t, AppendRecord(nil, closeMarker(nonce)), records)

	var c collect
	l, err = Open(path, nil, c.apply)
	require.NoError(t, err)
	assert.True(t, l.Stats().Clean)
	assert.Equal(t, []string{"Bone"}, c.payloads, "the marker is not a record")
	require.NoError(t, l.Close())
	again := readUsed(t, path)
	assert.Equal(t, raw, again, "opened and closed without a write: no second marker")

	l = openLog(t, path, nil)
	appendRecord(t, l, "Btwo")
	assert.Greater(t, l.Size(), int64(len(raw)), "written after the marker")
	require.NoError(t, l.Close())
	c = collect{}
	l, err = Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	assert.True(t, l.Stats().Clean, "closed again after a write")
	assert.Equal(t, []string{"Bone", "Btwo"}, c.payloads)
	require.NoError(t, l.Close())

	cp := filepath.Join(t.TempDir(), "crashed")
	require.NoError(t, os.WriteFile(cp, crashed, 0o600))
	l = openLog(t, cp, nil)
	assert.False(t, l.Stats().Clean, "a file a crash left")
	require.NoError(t, l.Close())

	injected := errors.New("injected sync failure")
	path = logPath(t)
	var fail atomic.Bool
	l = openLog(t, path, &Options{Fault: func(s string) error {
		if s == "sync" && fail.Load() {
			return injected
		}
		return nil
	}})
	appendRecord(t, l, "Bone")
	fail.Store(true)
	b := appendNoWait(t, l, "Bfails")
	<-b.Done()
	require.ErrorIs(t, b.Err(), injected)
	assert.ErrorIs(t, l.Close(), injected)
	res, got := replayFile(t, path)
	assert.False(t, res.Clean, "no marker after a failed write")
	assert.Equal(t, []string{"Bone"}, got, "the failed batch was cut off")
}

// A file deleted or replaced under an open log stops its writes with
// ErrReplaced: they would go to a file nobody reads again. The file now
// at the path is left as it is, and a deleted one is not created again.
// Checked to fail with the identity check removed from the write.
func TestLogNoticesReplacedFile(t *testing.T) {
	other := []byte("someone else's file\n")
	tests := []struct {
		name string
		give func(path string) error
		want []byte // at the path afterwards; nil: nothing there
	}{
		{name: "deleted", give: os.Remove},
		{name: "replaced", give: func(path string) error {
			if err := os.WriteFile(path+".new", other, 0o600); err != nil {
				return err
			}
			return os.Rename(path+".new", path)
		}, want: other},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := logPath(t)
			l := openLog(t, path, nil)
			appendRecord(t, l, "Bone")
			require.NoError(t, tt.give(path))

			b := appendNoWait(t, l, "Blost")
			<-b.Done()
			assert.ErrorIs(t, b.Err(), ErrReplaced)
			assert.ErrorIs(t, l.Writable(), ErrReplaced, "writes stay stopped")
			_, _, err := l.Append(16, 1, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bmore")) })
			assert.ErrorIs(t, err, ErrReplaced)
			assert.ErrorIs(t, l.Close(), ErrReplaced)

			got, err := os.ReadFile(path)
			if tt.want == nil {
				assert.ErrorIs(t, err, os.ErrNotExist)
			} else {
				require.NoError(t, err)
				assert.Equal(t, tt.want, got, "the file at the path is not written")
			}
		})
	}
}

// Two writers never share a file: a second Open for writing fails at
// once with ErrLocked (the lock belongs to the open file, so this holds
// within one process too), while a read-only
// open, which takes no lock, goes ahead. Once the writer closes, the
// file opens for writing again.
func TestOpenLocked(t *testing.T) {
	path := logPath(t)
	l := openLog(t, path, nil)
	appendRecord(t, l, "Bone")

	_, err := Open(path, nil, (&collect{}).apply)
	assert.ErrorIs(t, err, ErrLocked)
	var c collect
	ro, err := Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	assert.Equal(t, []string{"Bone"}, c.payloads)
	require.NoError(t, ro.Close())

	require.NoError(t, l.Close())
	l = openLog(t, path, nil)
	require.NoError(t, l.Close())
}

func TestLogAppendReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, nil, (&collect{}).apply)
	require.NoError(t, err)
	appendRecord(t, l, "Bone")
	appendRecord(t, l, "Btwo")
	require.NoError(t, l.Close())
	assert.ErrorIs(t, l.Flush(context.Background()), ErrClosed)

	var c collect
	l, err = Open(path, nil, c.apply)
	require.NoError(t, err)
	assert.Equal(t, []string{"Bone", "Btwo"}, c.payloads, "the close marker is not a record")
	assert.True(t, l.Stats().Clean)
	require.NoError(t, l.Close())
}
