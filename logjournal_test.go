//go:build idemhttp_logjournal

// Experimental, not built by default (issue 4, still open): an
// append-only log engine for the journal, measured at 0.45x to 0.50x of
// unjournaled throughput at concurrency 64 against bbolt's 0.31x. Known
// gaps before it may ship: a crash that leaves a hole inside the last,
// unacknowledged batch with valid records after it is reported as
// ErrJournalCorrupt instead of truncated (records need a batch sequence or
// commit marker); compaction only on Open; no Entries/Delete/Verify; body
// CRCs checked only at Open. Build and test with -tags idemhttp_logjournal.

package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/journaltest"
)

func ljOpen(t *testing.T, path string, opts *idemhttp.JournalOptions) *idemhttp.LogJournal {
	t.Helper()
	j, err := idemhttp.OpenLogJournal(path, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

var ljBase = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func ljEntry(key, op string, n int) *idemhttp.Entry {
	created := ljBase.Add(time.Duration(n) * time.Second)
	return &idemhttp.Entry{
		Operation:   op,
		Key:         key,
		Method:      http.MethodPost,
		URL:         "https://api.example.com/v1/charges",
		Header:      http.Header{"Content-Type": {"application/json"}},
		Body:        []byte(`{"amount":100,"key":"` + key + `"}`),
		Fingerprint: "fp-" + key,
		Created:     created,
		Updated:     created,
		State:       idemhttp.StatePending,
	}
}

func TestLogJournalConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
		return ljOpen(t, filepath.Join(t.TempDir(), "journal.log"), nil)
	})
}

// ljFill writes three entries (k0 done, k1 and k2 pending) and closes the
// journal.
func ljFill(t *testing.T, path string) {
	t.Helper()
	ctx := context.Background()
	j, err := idemhttp.OpenLogJournal(path, nil)
	require.NoError(t, err)
	for i := range 3 {
		old, err := j.Begin(ctx, ljEntry(fmt.Sprintf("k%d", i), fmt.Sprintf("op%d", i), i))
		require.NoError(t, err)
		require.Nil(t, old)
	}
	require.NoError(t, j.Finish(ctx, "k0", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1, At: ljBase.Add(time.Minute)}))
	require.NoError(t, j.Close())
}

func ljPendingKeys(t *testing.T, j *idemhttp.LogJournal) []string {
	t.Helper()
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	var keys []string
	for _, e := range pending {
		keys = append(keys, e.Key)
	}
	return keys
}

func TestLogJournalReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	ljFill(t, path)
	j := ljOpen(t, path, nil)
	assert.Equal(t, []string{"k1", "k2"}, ljPendingKeys(t, j))
	e, err := j.Get(context.Background(), "k0")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, e.State)
	assert.Equal(t, 201, e.LastStatus)
	assert.Equal(t, 1, e.Attempts)
	assert.Equal(t, ljEntry("k0", "", 0).Body, e.Body)
	// The operation index survives too.
	old, err := j.Begin(context.Background(), ljEntry("other", "op1", 9))
	require.NoError(t, err)
	require.NotNil(t, old)
	assert.Equal(t, "k1", old.Key)
}

func TestLogJournalTornTailTruncated(t *testing.T) {
	tests := []struct {
		name string
		give func(valid []byte) []byte // the bytes appended after the valid records
	}{
		{"partial header", func([]byte) []byte { return []byte{0x20, 0, 0} }},
		{"partial record", func(valid []byte) []byte { return valid[:40] }},
		{"bad crc", func(valid []byte) []byte {
			r := bytes.Clone(valid[:min(len(valid), 120)])
			r[len(r)-1] ^= 0xff
			return r
		}},
		{"zeroes", func([]byte) []byte { return make([]byte, 4096) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.log")
			ljFill(t, path)
			valid, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, append(bytes.Clone(valid), tt.give(valid)...), 0o600))

			j := ljOpen(t, path, nil)
			assert.Equal(t, []string{"k1", "k2"}, ljPendingKeys(t, j))
			fi, err := os.Stat(path)
			require.NoError(t, err)
			assert.Equal(t, int64(len(valid)), fi.Size(), "the torn tail is truncated away")

			// New records go where the torn one was, and survive a reopen.
			_, err = j.Begin(context.Background(), ljEntry("k3", "", 3))
			require.NoError(t, err)
			require.NoError(t, j.Close())
			j2 := ljOpen(t, path, nil)
			assert.Equal(t, []string{"k1", "k2", "k3"}, ljPendingKeys(t, j2))
		})
	}
}

func TestLogJournalCorruptMiddle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	ljFill(t, path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[20] ^= 0x01 // inside the first record, followed by valid ones
	require.NoError(t, os.WriteFile(path, data, 0o600))

	_, err = idemhttp.OpenLogJournal(path, nil)
	assert.ErrorIs(t, err, idemhttp.ErrJournalCorrupt)
	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, data, after, "a corrupt journal is left as it is")
}

func TestLogJournalLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	j, err := idemhttp.OpenLogJournal(path, nil)
	require.NoError(t, err)
	start := time.Now()
	_, err = idemhttp.OpenLogJournal(path, nil)
	assert.ErrorIs(t, err, idemhttp.ErrJournalLocked)
	assert.Less(t, time.Since(start), 50*time.Millisecond, "locked is reported at once")
	require.NoError(t, j.Close())
	j2, err := idemhttp.OpenLogJournal(path, nil)
	require.NoError(t, err)
	require.NoError(t, j2.Close())
}

func TestLogJournalSecretsNotInFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	j := ljOpen(t, path, &idemhttp.JournalOptions{SecretHeaders: []string{"x-api-key"}})
	e := ljEntry("k1", "", 0)
	e.URL = "https://alice:hunter2pw@api.example.com/v1/charges"
	e.Header.Set("Authorization", "Bearer sk_live_authsecret")
	e.Header.Set("Cookie", "session=cookiesecret")
	e.Header.Set("Proxy-Authorization", "Basic proxysecret")
	e.Header.Set("X-Api-Key", "apikeysecret")
	_, err := j.Begin(context.Background(), e)
	require.NoError(t, err)
	require.NoError(t, j.Close())

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, secret := range []string{"hunter2pw", "sk_live_authsecret", "cookiesecret", "proxysecret", "apikeysecret"} {
		assert.NotContains(t, string(raw), secret)
	}
	assert.Contains(t, string(raw), "application/json")
}

func TestLogJournalOmitBodies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	j := ljOpen(t, path, &idemhttp.JournalOptions{OmitBodies: true})
	_, err := j.Begin(context.Background(), ljEntry("k1", "", 0))
	require.NoError(t, err)
	got, err := j.Get(context.Background(), "k1")
	require.NoError(t, err)
	assert.Nil(t, got.Body)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), `"amount":100`)
}

func TestLogJournalMode0600(t *testing.T) {
	dir := t.TempDir()
	fresh := filepath.Join(dir, "fresh.log")
	ljOpen(t, fresh, nil)
	fi, err := os.Stat(fresh)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	loose := filepath.Join(dir, "loose.log")
	require.NoError(t, os.WriteFile(loose, nil, 0o644))
	require.NoError(t, os.Chmod(loose, 0o644))
	ljOpen(t, loose, nil)
	fi, err = os.Stat(loose)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
}

func TestLogJournalCompactsOnOpen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal.log")
	j, err := idemhttp.OpenLogJournal(path, nil)
	require.NoError(t, err)
	for i := range 20 {
		key := fmt.Sprintf("k%02d", i)
		_, err := j.Begin(ctx, ljEntry(key, "op-"+key, i))
		require.NoError(t, err)
		if i%10 != 0 {
			require.NoError(t, j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: ljBase}))
		}
	}
	n, err := j.Prune(ctx, ljBase.Add(time.Second))
	require.NoError(t, err)
	assert.Equal(t, 18, n)
	require.NoError(t, j.Close())
	before, err := os.Stat(path)
	require.NoError(t, err)

	j2 := ljOpen(t, path, nil)
	after, err := os.Stat(path)
	require.NoError(t, err)
	assert.Less(t, after.Size(), before.Size()/4, "dead records are dropped")
	assert.Equal(t, os.FileMode(0o600), after.Mode().Perm())
	assert.NoFileExists(t, path+".tmp")
	assert.Equal(t, []string{"k00", "k10"}, ljPendingKeys(t, j2))
	e, err := j2.Get(ctx, "k10")
	require.NoError(t, err)
	assert.Equal(t, ljEntry("k10", "", 0).Body, e.Body)
	_, err = j2.Get(ctx, "k05")
	assert.ErrorIs(t, err, idemhttp.ErrNotFound)

	// Still locked after the rename, and still writable.
	_, err = idemhttp.OpenLogJournal(path, nil)
	assert.ErrorIs(t, err, idemhttp.ErrJournalLocked)
	require.NoError(t, j2.Finish(ctx, "k10", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, At: ljBase}))
	require.NoError(t, j2.Close())
	j3 := ljOpen(t, path, nil)
	assert.Equal(t, []string{"k00"}, ljPendingKeys(t, j3))
}

func TestLogJournalGroupCommit(t *testing.T) {
	ctx := context.Background()
	j := ljOpen(t, filepath.Join(t.TempDir(), "journal.log"), nil)
	const n = 64
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			key := fmt.Sprintf("k%02d", i)
			if _, errs[i] = j.Begin(ctx, ljEntry(key, "", i)); errs[i] == nil {
				errs[i] = j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1})
			}
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
	}
	st := j.Stats()
	assert.Equal(t, uint64(2*n), st.Writes)
	assert.LessOrEqual(t, st.Commits, st.Writes)
	t.Logf("%d records in %d syncs", st.Writes, st.Commits)

	// A lone caller pays exactly one sync per write.
	before := j.Stats().Commits
	_, err := j.Begin(ctx, ljEntry("alone", "", 0))
	require.NoError(t, err)
	assert.Equal(t, before+1, j.Stats().Commits)
}

func TestLogJournalClosed(t *testing.T) {
	ctx := context.Background()
	j, err := idemhttp.OpenLogJournal(filepath.Join(t.TempDir(), "journal.log"), nil)
	require.NoError(t, err)
	require.NoError(t, j.Close())
	require.NoError(t, j.Close())
	_, err = j.Begin(ctx, ljEntry("k1", "", 0))
	assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
	assert.ErrorIs(t, j.Finish(ctx, "k1", idemhttp.Outcome{State: idemhttp.StateDone}), idemhttp.ErrJournalClosed)
	_, err = j.Get(ctx, "k1")
	assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
	_, err = j.Pending(ctx)
	assert.ErrorIs(t, err, idemhttp.ErrJournalClosed)
}

// ljFrame seals payload as the log's record framing does: length, then
// CRC-32C of the length bytes and the payload.
func ljFrame(payload []byte) []byte {
	var h [8]byte
	binary.LittleEndian.PutUint32(h[:4], uint32(len(payload)))
	tab := crc32.MakeTable(crc32.Castagnoli)
	binary.LittleEndian.PutUint32(h[4:], crc32.Update(crc32.Checksum(h[:4], tab), tab, payload))
	return append(h[:], payload...)
}

// FuzzLogRecord feeds arbitrary files to OpenLogJournal: it must never
// panic, must refuse what it cannot read with ErrJournalCorrupt, and what
// it accepts must read back the same after a reopen. With framed set, the
// input is sealed as one record's payload first, so that the fuzzer
// reaches the record decoder past the CRC.
func FuzzLogRecord(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, "seed.log")
	j, err := idemhttp.OpenLogJournal(path, nil)
	require.NoError(f, err)
	ctx := context.Background()
	_, err = j.Begin(ctx, ljEntry("k1", "op1", 0))
	require.NoError(f, err)
	require.NoError(f, j.Finish(ctx, "k1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: ljBase}))
	_, err = j.Begin(ctx, ljEntry("k2", "", 1))
	require.NoError(f, err)
	_, err = j.Prune(ctx, ljBase.Add(time.Hour))
	require.NoError(f, err)
	require.NoError(f, j.Close())
	seed, err := os.ReadFile(path)
	require.NoError(f, err)
	f.Add(seed, false)
	f.Add(seed[:len(seed)-3], false)
	f.Add([]byte{}, false)
	f.Add(make([]byte, 16), false)
	for off := 0; off+8 <= len(seed); {
		n := int(binary.LittleEndian.Uint32(seed[off:]))
		f.Add(seed[off+8:off+8+n], true) // each record's payload
		off += 8 + n
	}

	f.Fuzz(func(t *testing.T, data []byte, framed bool) {
		if framed {
			data = ljFrame(data)
		}
		path := filepath.Join(t.TempDir(), "journal.log")
		require.NoError(t, os.WriteFile(path, data, 0o600))
		j, err := idemhttp.OpenLogJournal(path, nil)
		if err != nil {
			assert.ErrorIs(t, err, idemhttp.ErrJournalCorrupt)
			return
		}
		p1, err := j.Pending(context.Background())
		require.NoError(t, err)
		require.NoError(t, j.Close())
		j, err = idemhttp.OpenLogJournal(path, nil)
		require.NoError(t, err, "an accepted file must reopen")
		p2, err := j.Pending(context.Background())
		require.NoError(t, err)
		require.NoError(t, j.Close())
		assert.Equal(t, len(p1), len(p2))
		for i := range min(len(p1), len(p2)) {
			assert.Equal(t, p1[i].Key, p2[i].Key)
			assert.Equal(t, p1[i].Body, p2[i].Body)
		}
	})
}

// The crash test: this test binary runs again as a child that sends a
// batch through a LogJournal and is SIGKILLed at a chosen point; the
// parent reopens the journal, resumes, reruns the batch and counts
// executions on a deduplicating server. A compact copy of crash_test.go,
// whose helpers are in the internal test package.

const (
	ljCrashEnvPoint   = "IDEMHTTP_LOGCRASH_POINT"
	ljCrashEnvJournal = "IDEMHTTP_LOGCRASH_JOURNAL"
	ljCrashEnvURL     = "IDEMHTTP_LOGCRASH_URL"
	ljCrashOps        = 6
	ljCrashVictim     = "op-3"
)

type ljKillJournal struct {
	idemhttp.Journal
	point string
}

func ljDie() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func (k ljKillJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	if k.point == "before-entry" && e.Operation == ljCrashVictim {
		ljDie()
	}
	old, err := k.Journal.Begin(ctx, e)
	if k.point == "after-entry" && e.Operation == ljCrashVictim {
		ljDie()
	}
	return old, err
}

func (k ljKillJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	if k.point == "before-finish" {
		if e, err := k.Journal.Get(ctx, key); err == nil && e.Operation == ljCrashVictim {
			ljDie()
		}
	}
	return k.Journal.Finish(ctx, key, o)
}

func ljRunBatch(t testing.TB, c *idemhttp.Client, url string) map[string]int {
	statuses := map[string]int{}
	for i := range ljCrashOps {
		op := fmt.Sprintf("op-%d", i)
		ctx := idemhttp.WithOperation(context.Background(), op)
		body := fmt.Sprintf(`{"operation":%q,"amount":%d}`, op, 100+i)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := c.Do(req)
		if err != nil {
			statuses[op] = -1
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		statuses[op] = resp.StatusCode
	}
	return statuses
}

func TestLogCrashChild(t *testing.T) {
	point := os.Getenv(ljCrashEnvPoint)
	if point == "" {
		t.Skip("run by TestLogCrashAndResume as a child process")
	}
	lj, err := idemhttp.OpenLogJournal(os.Getenv(ljCrashEnvJournal), nil)
	require.NoError(t, err)
	c := &idemhttp.Client{Journal: ljKillJournal{Journal: lj, point: point}, Policy: &idemhttp.Policy{BaseDelay: time.Millisecond}}
	ljRunBatch(t, c, os.Getenv(ljCrashEnvURL))
	_ = lj.Close()
}

// ljDedupServer runs each key's effect once and replays afterwards.
type ljDedupServer struct {
	mu       sync.Mutex
	done     map[string]string
	effects  map[string]int
	onCommit func(op string)
}

func (s *ljDedupServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	b, _ := io.ReadAll(r.Body)
	var body struct {
		Operation string `json:"operation"`
	}
	_ = json.Unmarshal(b, &body)
	s.mu.Lock()
	if stored, ok := s.done[key]; ok {
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		_, _ = io.WriteString(w, stored)
		return
	}
	s.effects[body.Operation]++
	stored := fmt.Sprintf(`{"id":"ch_%s"}`, body.Operation)
	s.done[key] = stored
	hook := s.onCommit
	s.mu.Unlock()
	if hook != nil {
		hook(body.Operation)
	}
	_, _ = io.WriteString(w, stored)
}

func TestLogCrashAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	for _, point := range []string{"before-entry", "after-entry", "after-commit", "before-finish"} {
		t.Run(point, func(t *testing.T) {
			srv := &ljDedupServer{done: map[string]string{}, effects: map[string]int{}}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			path := filepath.Join(t.TempDir(), "journal.log")

			cmd := exec.Command(os.Args[0], "-test.run=^TestLogCrashChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), ljCrashEnvPoint+"="+point, ljCrashEnvJournal+"="+path, ljCrashEnvURL+"="+ts.URL)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			child := make(chan *os.Process, 1)
			if point == "after-commit" {
				srv.mu.Lock()
				srv.onCommit = func(op string) {
					if op == ljCrashVictim {
						_ = (<-child).Kill()
					}
				}
				srv.mu.Unlock()
			}
			require.NoError(t, cmd.Start())
			child <- cmd.Process
			err := cmd.Wait()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "the child must die, output:\n%s", out.String())
			ws, ok := ee.Sys().(syscall.WaitStatus)
			require.True(t, ok)
			require.True(t, ws.Signaled(), "killed by a signal, output:\n%s", out.String())
			assert.Equal(t, syscall.SIGKILL, ws.Signal())
			srv.mu.Lock()
			srv.onCommit = nil
			srv.mu.Unlock()

			lj, err := idemhttp.OpenLogJournal(path, nil)
			require.NoError(t, err)
			defer lj.Close()
			c := &idemhttp.Client{Journal: lj, Policy: &idemhttp.Policy{BaseDelay: time.Millisecond}}
			results, err := c.Resume(context.Background())
			require.NoError(t, err)
			for _, r := range results {
				assert.NoError(t, r.Err, "resume %s", r.Entry.Operation)
			}
			statuses := ljRunBatch(t, c, ts.URL)
			effects := func() map[string]int {
				srv.mu.Lock()
				defer srv.mu.Unlock()
				return maps(srv.effects)
			}()
			for i := range ljCrashOps {
				op := fmt.Sprintf("op-%d", i)
				assert.Equal(t, 1, effects[op], "%s must run exactly once", op)
				assert.Equal(t, http.StatusOK, statuses[op], "%s must end ok", op)
			}
			pending, err := lj.Pending(context.Background())
			require.NoError(t, err)
			assert.Empty(t, pending)
		})
	}
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
