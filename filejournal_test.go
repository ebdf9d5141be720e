package idemhttp_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/journaltest"
)

func fjOpen(t *testing.T, path string, opts *idemhttp.JournalOptions) *idemhttp.FileJournal {
	t.Helper()
	j, err := idemhttp.OpenFileJournal(path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, j.Close()) })
	return j
}

func fjPath(t *testing.T) string {
	return filepath.Join(t.TempDir(), "journal.db")
}

func fjEntry(key, operation string) *idemhttp.Entry {
	return &idemhttp.Entry{
		Operation:   operation,
		Key:         key,
		Method:      http.MethodPost,
		URL:         "https://api.example.com/v1/charges",
		Header:      http.Header{"Content-Type": {"application/json"}},
		Body:        []byte(`{"amount":100}`),
		Fingerprint: "fp-" + key,
		Created:     time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC),
	}
}

func TestFileJournalConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
		return fjOpen(t, fjPath(t), nil)
	})
}

func TestFileJournalSecretsNeverReachTheFile(t *testing.T) {
	path := fjPath(t)
	j, err := idemhttp.OpenFileJournal(path, &idemhttp.JournalOptions{SecretHeaders: []string{"x-api-key"}})
	require.NoError(t, err)

	ctx := context.Background()
	e := fjEntry("k1", "op-1")
	e.URL = "https://user:url_password_secret@api.example.com/v1/charges"
	e.Header = http.Header{
		"Authorization":       {"Bearer sk_live_secret"},
		"Cookie":              {"s=secret"},
		"Proxy-Authorization": {"Basic proxy_secret"},
		"X-Api-Key":           {"api_key_secret"},
		"Content-Type":        {"application/json"},
	}
	_, err = j.Begin(ctx, e)
	require.NoError(t, err)
	// Finish rewrites the entry: the rewrite must not bring anything back.
	require.NoError(t, j.Finish(ctx, "k1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))

	got, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, got.Header)
	assert.Equal(t, "https://user@api.example.com/v1/charges", got.URL)
	require.NoError(t, j.Close())

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Contains(raw, []byte("fp-k1")), "the entry is in the file")
	for _, secret := range []string{"sk_live_secret", "s=secret", "proxy_secret", "api_key_secret", "url_password_secret"} {
		assert.False(t, bytes.Contains(raw, []byte(secret)), "%q found in the journal file", secret)
	}
}

func TestFileJournalFileMode(t *testing.T) {
	tests := []struct {
		name string
		give os.FileMode // mode of a file that exists before opening; 0 for none
	}{
		{name: "new file", give: 0},
		{name: "existing empty file readable by all", give: 0o644},
		{name: "existing empty file writable by group", give: 0o660},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fjPath(t)
			if tt.give != 0 {
				require.NoError(t, os.WriteFile(path, nil, tt.give))
				require.NoError(t, os.Chmod(path, tt.give)) // past the umask
			}
			fjOpen(t, path, nil)
			fi, err := os.Stat(path)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		})
	}
}

func TestFileJournalSecondOpenFailsFast(t *testing.T) {
	path := fjPath(t)
	first, err := idemhttp.OpenFileJournal(path, nil)
	require.NoError(t, err)

	start := time.Now()
	second, err := idemhttp.OpenFileJournal(path, nil)
	assert.ErrorIs(t, err, idemhttp.ErrJournalLocked)
	assert.Nil(t, second)
	assert.Less(t, time.Since(start), time.Second)

	require.NoError(t, first.Close())
	again, err := idemhttp.OpenFileJournal(path, nil)
	require.NoError(t, err, "Close releases the lock")
	require.NoError(t, again.Close())
}

// fjHolderEnv makes the test binary, run as a child, hold a journal
// open until killed.
const fjHolderEnv = "IDEMHTTP_TEST_HOLD_JOURNAL"

func TestFileJournalLockedByAnotherProcess(t *testing.T) {
	path := fjPath(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFileJournalHolderProcess$")
	cmd.Env = append(os.Environ(), fjHolderEnv+"="+path)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "holding\n", line)

	start := time.Now()
	_, err = idemhttp.OpenFileJournal(path, nil)
	assert.ErrorIs(t, err, idemhttp.ErrJournalLocked)
	assert.Less(t, time.Since(start), time.Second)

	// The kernel releases the lock when the holder dies, even by SIGKILL.
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	j := fjOpen(t, path, nil)
	_, err = j.Get(context.Background(), "held")
	assert.NoError(t, err, "the child's entry is durable")
}

// TestFileJournalHolderProcess is the child of
// TestFileJournalLockedByAnotherProcess; run directly, it does nothing.
func TestFileJournalHolderProcess(t *testing.T) {
	path := os.Getenv(fjHolderEnv)
	if path == "" {
		t.Skip("runs only as a child process")
	}
	j, err := idemhttp.OpenFileJournal(path, nil)
	require.NoError(t, err)
	_, err = j.Begin(context.Background(), fjEntry("held", ""))
	require.NoError(t, err)
	fmt.Println("holding")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent kills us
	require.NoError(t, j.Close())
}

func TestFileJournalOmitBodies(t *testing.T) {
	path := fjPath(t)
	j := fjOpen(t, path, &idemhttp.JournalOptions{OmitBodies: true})
	e := fjEntry("k1", "")
	e.Body = []byte("card_number_4242424242424242")
	_, err := j.Begin(context.Background(), e)
	require.NoError(t, err)

	got, err := j.Get(context.Background(), "k1")
	require.NoError(t, err)
	assert.Nil(t, got.Body)
	assert.Equal(t, "fp-k1", got.Fingerprint)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.False(t, bytes.Contains(raw, []byte("4242424242424242")))
}

func TestFileJournalBeginDefaultsTimes(t *testing.T) {
	j := fjOpen(t, fjPath(t), nil)
	before := time.Now()
	_, err := j.Begin(context.Background(), &idemhttp.Entry{Key: "k1", State: idemhttp.StateDone})
	require.NoError(t, err)

	got, err := j.Get(context.Background(), "k1")
	require.NoError(t, err)
	assert.WithinRange(t, got.Created, before.Add(-time.Millisecond), time.Now())
	assert.True(t, got.Updated.Equal(got.Created))
	assert.Equal(t, idemhttp.StatePending, got.State, "Begin always records pending")
}

func TestFileJournalRejectsBadInput(t *testing.T) {
	j := fjOpen(t, fjPath(t), nil)
	ctx := context.Background()
	tests := []struct {
		name string
		give *idemhttp.Entry
		want error
	}{
		{name: "nil entry", give: nil, want: idemhttp.ErrInvalidRequest},
		{name: "empty key", give: &idemhttp.Entry{}, want: idemhttp.ErrInvalidKey},
		{name: "key with newline", give: &idemhttp.Entry{Key: "a\nb"}, want: idemhttp.ErrInvalidKey},
		{name: "long operation", give: &idemhttp.Entry{Key: "k", Operation: string(make([]byte, 300))}, want: idemhttp.ErrInvalidRequest},
		{name: "negative attempts", give: &idemhttp.Entry{Key: "k", Attempts: -1}, want: idemhttp.ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := j.Begin(ctx, tt.give)
			assert.ErrorIs(t, err, tt.want)
		})
	}
	_, err := j.Begin(ctx, fjEntry("k", ""))
	require.NoError(t, err)
	assert.ErrorIs(t, j.Finish(ctx, "k", idemhttp.Outcome{State: "lost"}), idemhttp.ErrInvalidRequest)
	assert.ErrorIs(t, j.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Attempts: -1}), idemhttp.ErrInvalidRequest)
	assert.Equal(t, idemhttp.JournalStats{Writes: 1, Commits: 1}, j.Stats(), "rejected calls never reach the file")
}

func TestFileJournalSurvivesReopen(t *testing.T) {
	path := fjPath(t)
	ctx := context.Background()
	j, err := idemhttp.OpenFileJournal(path, nil)
	require.NoError(t, err)
	for _, key := range []string{"a", "b", "c"} {
		_, err := j.Begin(ctx, fjEntry(key, "op-"+key))
		require.NoError(t, err)
	}
	require.NoError(t, j.Finish(ctx, "b", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1}))
	require.NoError(t, j.Close())

	j = fjOpen(t, path, nil)
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 2)
	assert.Equal(t, "a", pending[0].Key)
	assert.Equal(t, "c", pending[1].Key)
	existing, err := j.Begin(ctx, fjEntry("b2", "op-b"))
	require.NoError(t, err)
	require.NotNil(t, existing, "the operation's key survives a restart")
	assert.Equal(t, "b", existing.Key)
}

func TestFileJournalEntriesAndDelete(t *testing.T) {
	j := fjOpen(t, fjPath(t), nil)
	ctx := context.Background()
	for i, key := range []string{"c", "a", "b"} {
		e := fjEntry(key, "op-"+key)
		e.Created = e.Created.Add(time.Duration(i) * time.Second)
		_, err := j.Begin(ctx, e)
		require.NoError(t, err)
	}
	require.NoError(t, j.Finish(ctx, "a", idemhttp.Outcome{State: idemhttp.StateDone, Attempts: 1}))
	require.NoError(t, j.Finish(ctx, "b", idemhttp.Outcome{State: idemhttp.StateAbandoned, Attempts: 1}))

	all, err := j.Entries(ctx)
	require.NoError(t, err)
	var got []string
	for _, e := range all {
		got = append(got, e.Key+":"+string(e.State))
	}
	assert.Equal(t, []string{"c:pending", "a:done", "b:abandoned"}, got)

	for _, key := range []string{"a", "b", "c"} {
		require.NoError(t, j.Delete(ctx, key))
	}
	assert.ErrorIs(t, j.Delete(ctx, "a"), idemhttp.ErrNotFound)
	all, err = j.Entries(ctx)
	require.NoError(t, err)
	assert.Empty(t, all)
	require.NoError(t, j.Verify(ctx), "no index record outlives its entry")
	existing, err := j.Begin(ctx, fjEntry("a2", "op-a"))
	require.NoError(t, err)
	assert.Nil(t, existing, "a deleted entry's operation is free again")
}

// A large prune runs in several transactions, so concurrent writers wait
// for one chunk at most, not for the whole prune.
func TestFileJournalPruneInChunks(t *testing.T) {
	j := fjOpen(t, fjPath(t), nil)
	ctx := context.Background()
	const n = 2100
	done := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	keys := make(chan string)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for key := range keys {
				_, err := j.Begin(ctx, fjEntry(key, ""))
				assert.NoError(t, err)
				assert.NoError(t, j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: done}))
			}
		})
	}
	for i := range n {
		keys <- fmt.Sprintf("k%04d", i)
	}
	close(keys)
	wg.Wait()

	before := j.Stats()
	pruned, err := j.Prune(ctx, done.Add(time.Second))
	require.NoError(t, err)
	assert.Equal(t, n, pruned)
	assert.Equal(t, uint64(3), j.Stats().Commits-before.Commits, "1000 + 1000 + 100")
	all, err := j.Entries(ctx)
	require.NoError(t, err)
	assert.Empty(t, all)
}

func TestFileJournalClosed(t *testing.T) {
	j, err := idemhttp.OpenFileJournal(fjPath(t), nil)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.NoError(t, j.Close(), "Close is idempotent")

	ctx := context.Background()
	_, err = j.Begin(ctx, fjEntry("k", ""))
	assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
	_, err = j.Get(ctx, "k")
	assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
	_, err = j.Pending(ctx)
	assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
	_, err = j.Prune(ctx, time.Now())
	assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
}

// Close during concurrent writes: every write either fails with
// ErrJournalClosed or is on disk.
func TestFileJournalCloseDuringWrites(t *testing.T) {
	path := fjPath(t)
	j, err := idemhttp.OpenFileJournal(path, nil)
	require.NoError(t, err)

	const n = 40
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, errs[i] = j.Begin(context.Background(), fjEntry(fmt.Sprintf("k%02d", i), ""))
		})
	}
	close(start)
	require.NoError(t, j.Close())
	wg.Wait()

	j = fjOpen(t, path, nil)
	for i, err := range errs {
		_, getErr := j.Get(context.Background(), fmt.Sprintf("k%02d", i))
		if err == nil {
			assert.NoError(t, getErr, "write %d reported success but is not on disk", i)
		} else {
			assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
			assert.ErrorIs(t, getErr, idemhttp.ErrNotFound)
		}
	}
}

func TestFileJournalGroupCommit(t *testing.T) {
	ctx := context.Background()
	t.Run("lone writer commits once per write, at once", func(t *testing.T) {
		j := fjOpen(t, fjPath(t), nil)
		for i := range 5 {
			key := fmt.Sprintf("k%d", i)
			_, err := j.Begin(ctx, fjEntry(key, ""))
			require.NoError(t, err)
			require.NoError(t, j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1}))
		}
		existing, err := j.Begin(ctx, fjEntry("k0", ""))
		require.NoError(t, err)
		require.NotNil(t, existing)
		assert.Equal(t, idemhttp.JournalStats{Writes: 11, Commits: 10}, j.Stats(), "a Begin that finds its entry commits nothing")
	})
	t.Run("concurrent writers share commits", func(t *testing.T) {
		j := fjOpen(t, fjPath(t), nil)
		const n = 64
		var wg sync.WaitGroup
		errs := make([]error, n)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				key := fmt.Sprintf("k%02d", i)
				if _, errs[i] = j.Begin(ctx, fjEntry(key, "")); errs[i] == nil {
					errs[i] = j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1})
				}
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "writer %d", i)
		}
		st := j.Stats()
		t.Logf("%d writes in %d commits", st.Writes, st.Commits)
		assert.Equal(t, uint64(2*n), st.Writes)
		assert.Less(t, st.Commits, st.Writes)
	})
}

// Writers whose contexts end while they wait behind other commits: a
// Begin that fails wrote nothing, and one that succeeded is on disk, so the
// caller's view and the file always agree.
func TestFileJournalCancelUnderContention(t *testing.T) {
	path := fjPath(t)
	j, err := idemhttp.OpenFileJournal(path, nil)
	require.NoError(t, err)
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// Deadlines from 0 to ~1 ms: some expire before the call, some
			// in the queue, some never.
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%20)*50*time.Microsecond)
			defer cancel()
			_, errs[i] = j.Begin(ctx, fjEntry(fmt.Sprintf("k%03d", i), fmt.Sprintf("op-%03d", i)))
		})
	}
	wg.Wait()
	require.NoError(t, j.Close())

	j = fjOpen(t, path, nil) // verifies the indexes too
	var stored, refused int
	for i, err := range errs {
		_, getErr := j.Get(context.Background(), fmt.Sprintf("k%03d", i))
		if err == nil {
			stored++
			assert.NoError(t, getErr, "Begin %d succeeded but its entry is missing", i)
		} else {
			refused++
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorIs(t, getErr, idemhttp.ErrNotFound, "Begin %d failed but its entry was stored", i)
		}
	}
	t.Logf("%d stored, %d refused", stored, refused)
}

// fjCorruptJournal writes a journal with n entries whose bodies carry marker,
// closes it and returns its path and bytes.
func fjCorruptJournal(t *testing.T, n int, marker string) (string, []byte) {
	t.Helper()
	path := fjPath(t)
	j, err := idemhttp.OpenFileJournal(path, nil)
	require.NoError(t, err)
	for i := range n {
		e := fjEntry(fmt.Sprintf("key-%04d", i), fmt.Sprintf("op-%04d", i))
		e.Body = []byte(fmt.Sprintf("%s-%04d-%s", marker, i, bytes.Repeat([]byte("x"), 200)))
		_, err := j.Begin(context.Background(), e)
		require.NoError(t, err)
	}
	require.NoError(t, j.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	return path, raw
}

// fjFlipEvery returns a copy of b with the byte at offset off of every
// occurrence of pattern flipped. Every occurrence, because pages that bbolt
// freed still hold old copies of the records: flipping only the first copy
// might hit a dead one.
func fjFlipEvery(b, pattern []byte, off int) []byte {
	b = bytes.Clone(b)
	n := 0
	for i := 0; ; n++ {
		k := bytes.Index(b[i:], pattern)
		if k < 0 {
			break
		}
		b[i+k+off] ^= 0x01
		i += k + len(pattern)
	}
	if n == 0 {
		panic(fmt.Sprintf("pattern %q not in the file", pattern))
	}
	return b
}

// fjPendingIndexKey is the pending index's record for an entry created at
// created: Unix seconds with the sign bit flipped, nanoseconds, key.
func fjPendingIndexKey(created time.Time, key string) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(created.Unix())^(1<<63))
	b = binary.BigEndian.AppendUint32(b, uint32(created.Nanosecond()))
	return append(b, key...)
}

func TestFileJournalCorruptFile(t *testing.T) {
	const pageSize = 4096
	random := make([]byte, 16*pageSize)
	_, _ = rand.Read(random)
	tests := []struct {
		name    string
		give    func(valid []byte) []byte // the bytes written over a valid journal
		wantErr error                     // nil: opens
	}{
		{name: "zero length initialises", give: func([]byte) []byte { return nil }, wantErr: nil},
		{name: "random bytes", give: func([]byte) []byte { return random }, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "random bytes, one page", give: func([]byte) []byte { return random[:pageSize] }, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "shorter than a page", give: func(b []byte) []byte { return b[:100] }, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "truncated to the meta pages", give: func(b []byte) []byte { return b[:2*pageSize] }, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "truncated to half", give: func(b []byte) []byte { return b[:len(b)/2] }, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "truncated mid-page", give: func(b []byte) []byte { return b[:len(b)/2-pageSize/2] }, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "both meta pages zeroed", give: func(b []byte) []byte {
			return append(make([]byte, 2*pageSize), b[2*pageSize:]...)
		}, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "flipped byte in an entry's body", give: func(b []byte) []byte {
			return fjFlipEvery(b, []byte("MARKER-0007"), 7)
		}, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "flipped byte in a bucket key", give: func(b []byte) []byte {
			// A leaf stores each key between the previous record's value
			// and its own: in the key index, the sequence numbers of the
			// entries begun third and fourth.
			pattern := binary.BigEndian.AppendUint64(nil, 3)
			pattern = append(pattern, "key-0003"...)
			pattern = binary.BigEndian.AppendUint64(pattern, 4)
			return fjFlipEvery(b, pattern, 8+5)
		}, wantErr: idemhttp.ErrJournalCorrupt},
		{name: "flipped byte in the pending index", give: func(b []byte) []byte {
			return fjFlipEvery(b, fjPendingIndexKey(fjEntry("", "").Created, "key-0011"), 12+5)
		}, wantErr: idemhttp.ErrJournalCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, valid := fjCorruptJournal(t, 40, "MARKER")
			require.NoError(t, os.WriteFile(path, tt.give(valid), 0o600))

			j, err := idemhttp.OpenFileJournal(path, nil)
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				assert.Nil(t, j)
				return
			}
			require.NoError(t, err)
			require.NoError(t, j.Close())
		})
	}
}

// A damaged entry found with SkipVerify fails its own reads only, and can
// be deleted, after which the journal verifies clean.
func TestFileJournalRepairDamagedEntry(t *testing.T) {
	path, raw := fjCorruptJournal(t, 40, "MARKER")
	require.NoError(t, os.WriteFile(path, fjFlipEvery(raw, []byte("MARKER-0007"), 7), 0o600))

	_, err := idemhttp.OpenFileJournal(path, nil)
	require.ErrorIs(t, err, idemhttp.ErrJournalCorrupt)
	assert.ErrorContains(t, err, "key-0007", "the error names the damaged entry")

	j := fjOpen(t, path, &idemhttp.JournalOptions{SkipVerify: true})
	ctx := context.Background()
	_, err = j.Get(ctx, "key-0007")
	assert.ErrorIs(t, err, idemhttp.ErrJournalCorrupt)
	_, err = j.Pending(ctx)
	assert.ErrorIs(t, err, idemhttp.ErrJournalCorrupt)
	_, err = j.Get(ctx, "key-0008")
	assert.NoError(t, err)

	require.NoError(t, j.Delete(ctx, "key-0007"))
	require.NoError(t, j.Verify(ctx))
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Len(t, pending, 39)
	existing, err := j.Begin(ctx, fjEntry("key-new", "op-0007"))
	require.NoError(t, err)
	assert.Nil(t, existing, "the damaged entry's operation mapping went with it")
}

// A file of another format version, or a bbolt file that is not a
// journal, is refused on open with an error that says so; nothing in it is
// read as entries or changed.
func TestFileJournalRefusesOtherFormats(t *testing.T) {
	tests := []struct {
		name    string
		buckets map[string]map[string]string // bucket -> key -> value
		want    string
	}{
		{name: "version 1", buckets: map[string]map[string]string{
			"entries": {"k": "\x01..."}, "operations": {}, "pending": {}, "done": {},
		}, want: "journal format version 1"},
		{name: "future version", buckets: map[string]map[string]string{
			"idemhttp": {"version": "\x03"}, "keys": {}, "states": {}, "requests": {}, "operations": {}, "pending": {}, "done": {},
		}, want: "journal format version 03"},
		{name: "version 2 with a bucket missing", buckets: map[string]map[string]string{
			"idemhttp": {"version": "\x02"}, "keys": {}, "states": {}, "operations": {}, "pending": {}, "done": {},
		}, want: "bucket is missing"},
		{name: "another program's file", buckets: map[string]map[string]string{
			"widgets": {"w1": "blue"},
		}, want: "not an idemhttp journal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fjPath(t)
			db, err := bolt.Open(path, 0o600, nil)
			require.NoError(t, err)
			require.NoError(t, db.Update(func(tx *bolt.Tx) error {
				for name, kvs := range tt.buckets {
					b, err := tx.CreateBucket([]byte(name))
					if err != nil {
						return err
					}
					for k, v := range kvs {
						if err := b.Put([]byte(k), []byte(v)); err != nil {
							return err
						}
					}
				}
				return nil
			}))
			require.NoError(t, db.Close())
			before, err := os.ReadFile(path)
			require.NoError(t, err)

			j, err := idemhttp.OpenFileJournal(path, nil)
			assert.Nil(t, j)
			assert.ErrorIs(t, err, idemhttp.ErrJournalCorrupt)
			assert.ErrorContains(t, err, tt.want)
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, before, after, "the file is left as it was")
		})
	}
}

// Regression: a page header's overflow count damaged to about 1.5 billion
// (one flipped byte) made the first write free 1.5 billion pages one by
// one, hanging until memory ran out. The freelist page was the one hit:
// every commit replaces it. Open must refuse such a file at once.
func TestFileJournalHugeOverflowCountRefused(t *testing.T) {
	const pageSize = 4096
	path, raw := fjCorruptJournal(t, 40, "MARKER")
	damaged := 0
	for off := 2 * pageSize; off+16 <= len(raw); off += pageSize {
		// Page header: id (8 bytes), flags (2), count (2), overflow (4).
		id, flags := binary.LittleEndian.Uint64(raw[off:]), binary.LittleEndian.Uint16(raw[off+8:])
		if id == uint64(off/pageSize) && flags == 0x10 { // the freelist
			raw[off+15] ^= 0x5a
			damaged++
		}
	}
	require.Positive(t, damaged, "the file has a freelist page")
	require.NoError(t, os.WriteFile(path, raw, 0o600))

	j, err := idemhttp.OpenFileJournal(path, nil)
	assert.Nil(t, j)
	assert.ErrorIs(t, err, idemhttp.ErrJournalCorrupt)
	assert.ErrorContains(t, err, "overflow pages")
}

// Flipping bytes all over a journal file must give, on open or on use, a
// working journal or ErrJournalCorrupt: never a panic, a fault or a hang.
func TestFileJournalFlippedBytes(t *testing.T) {
	const pageSize = 4096
	_, valid := fjCorruptJournal(t, 40, "MARKER")
	// Every byte of every page header (id, flags, element count, overflow:
	// what bbolt's parsing trusts), and a sample of the rest.
	stride := 151
	if testing.Short() {
		stride = 1499
	}
	var offsets []int
	for page := 0; page < len(valid); page += pageSize {
		for i := range 16 {
			offsets = append(offsets, page+i)
		}
	}
	for off := 0; off < len(valid); off += stride {
		offsets = append(offsets, off)
	}

	dir := t.TempDir()
	var opened, refused int
	for _, off := range offsets {
		b := bytes.Clone(valid)
		b[off] ^= 0x5a
		path := filepath.Join(dir, fmt.Sprintf("flip-%d.db", off))
		require.NoError(t, os.WriteFile(path, b, 0o600))

		j, err := idemhttp.OpenFileJournal(path, nil)
		if err != nil {
			require.ErrorIs(t, err, idemhttp.ErrJournalCorrupt, "offset %d", off)
			refused++
			continue
		}
		opened++
		fjExercise(t, j, off)
		require.NoError(t, j.Close(), "offset %d", off)
		require.NoError(t, os.Remove(path))
	}
	t.Logf("%d flips: %d opened, %d refused", opened+refused, opened, refused)
}

// fjExercise uses a journal that opened despite a flipped byte: every
// call must succeed or fail with a plain error.
func fjExercise(t *testing.T, j *idemhttp.FileJournal, off int) {
	t.Helper()
	ctx := context.Background()
	okOrCorrupt := func(err error) {
		if err != nil && !errors.Is(err, idemhttp.ErrJournalCorrupt) && !errors.Is(err, idemhttp.ErrNotFound) {
			t.Errorf("offset %d: unexpected error: %v", off, err)
		}
	}
	_, err := j.Pending(ctx)
	okOrCorrupt(err)
	_, err = j.Get(ctx, "key-0010")
	okOrCorrupt(err)
	_, err = j.Begin(ctx, fjEntry("fresh", "op-fresh"))
	okOrCorrupt(err)
	okOrCorrupt(j.Finish(ctx, "key-0020", idemhttp.Outcome{State: idemhttp.StateDone, Attempts: 1}))
	_, err = j.Prune(ctx, time.Now())
	okOrCorrupt(err)
	_, err = j.Entries(ctx)
	okOrCorrupt(err)
}

func ExampleOpenFileJournal() {
	dir, err := os.MkdirTemp("", "idemhttp-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	j, err := idemhttp.OpenFileJournal(filepath.Join(dir, "journal.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()
	ctx := context.Background()

	// Record the operation, durably, before the first byte is sent.
	charge := &idemhttp.Entry{
		Operation: "order-42",
		Key:       "5b0ad5c2-7c1e-4c1a-9d0e-2f0c6a8e1b11",
		Method:    http.MethodPost,
		URL:       "https://api.example.com/v1/charges",
		Header:    http.Header{"Authorization": {"Bearer sk_live_secret"}},
		Body:      []byte(`{"amount":100}`),
	}
	existing, err := j.Begin(ctx, charge)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first run stored its key:", existing == nil)

	// Running the same operation again (after a crash, say) with a freshly
	// minted key gets the original key back, so the server can replay.
	rerun := *charge
	rerun.Key = "0e9d8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b"
	existing, err = j.Begin(ctx, &rerun)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("rerun uses key:", existing.Key)
	fmt.Println("credentials stored:", existing.Header.Get("Authorization") != "")

	// The server answered 201: the operation is done.
	err = j.Finish(ctx, existing.Key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	pending, err := j.Pending(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pending:", len(pending))
	// Output:
	// first run stored its key: true
	// rerun uses key: 5b0ad5c2-7c1e-4c1a-9d0e-2f0c6a8e1b11
	// credentials stored: false
	// pending: 0
}

func ExampleFileJournal_Pending() {
	dir, err := os.MkdirTemp("", "idemhttp-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "journal.db")
	ctx := context.Background()

	// A process records two requests and dies before either finishes.
	j, err := idemhttp.OpenFileJournal(path, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, key := range []string{"key-a", "key-b"} {
		if _, err := j.Begin(ctx, &idemhttp.Entry{Key: key, Method: http.MethodPost, URL: "https://api.example.com/v1/transfers"}); err != nil {
			fmt.Println(err)
			return
		}
	}
	_ = j.Close() // stands in for the crash: the writes were already on disk

	// The next run finds them, oldest first, to resend with the same keys.
	j, err = idemhttp.OpenFileJournal(path, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()
	pending, err := j.Pending(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range pending {
		fmt.Println(e.Method, e.URL, e.Key)
	}
	// Output:
	// POST https://api.example.com/v1/transfers key-a
	// POST https://api.example.com/v1/transfers key-b
}
