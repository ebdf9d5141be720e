package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newServer starts a fake API for one test.
func newServer(t *testing.T, f idemtest.Faults) *idemtest.Server {
	t.Helper()
	srv := idemtest.NewServer(&idemtest.Options{Faults: f})
	t.Cleanup(srv.Close)
	return srv
}

// assertOnce asserts that each of the first n operations ran exactly once.
func assertOnce(t *testing.T, srv *idemtest.Server, n int) {
	t.Helper()
	snap := srv.Snapshot()
	for i := range n {
		assert.Equal(t, 1, snap[opID(i)], "executions of %s", opID(i))
	}
	assert.Zero(t, srv.Stats().Duplicates)
}

// assertComplete asserts that res has an ok result for each of the first
// n operations.
func assertComplete(t *testing.T, res map[string]result, n int) {
	t.Helper()
	for i := range n {
		r, ok := res[opID(i)]
		if assert.True(t, ok, "no result for %s", opID(i)) {
			assert.Equal(t, resultOK, r.Result, "%s: %+v", opID(i), r)
		}
	}
}

func TestBatch(t *testing.T) {
	srv := newServer(t, idemtest.Faults{Seed: 3, DropRequest: 0.2, DropResponse: 0.2, Unavailable: 0.1, MaxPerOperation: 1})
	dir := t.TempDir()
	in := writeInput(t, dir, 20)
	journal := filepath.Join(dir, "journal")

	first := runIn("batch", "-url", srv.URL, "-in", in, "-journal", journal, "-concurrency", "4", "-progress", "lines")

	require.Equal(t, exitOK, first.code, first.stderr)
	res := results(t, first.stdout)
	assertComplete(t, res, 20)
	assertOnce(t, srv, 20)
	r := res[opID(3)]
	assert.Equal(t, sourceRun, r.Source)
	assert.Equal(t, idemhttp.StateDone, r.State)
	assert.Equal(t, 4, r.Line, "line numbers are 1-based")
	assert.Contains(t, string(r.Response), `"object":"charge"`)
	assert.NotEmpty(t, r.Key)
	assert.Contains(t, first.stderr, "idemctl batch: 20 operations")
	assert.Contains(t, first.stderr, "progress 20/20")

	// A rerun of a finished batch sends nothing.
	requests := srv.Stats().Requests
	second := runIn("batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none")

	require.Equal(t, exitOK, second.code, second.stderr)
	res2 := results(t, second.stdout)
	assertComplete(t, res2, 20)
	assert.True(t, res2[opID(3)].Skipped)
	assert.Equal(t, sourceJournal, res2[opID(3)].Source)
	assert.Equal(t, r.Key, res2[opID(3)].Key)
	assert.Equal(t, requests, srv.Stats().Requests, "done operations are not sent again")
}

// A batch killed with SIGKILL mid-way, as by the OOM killer or a lost
// machine, and rerun: the operations in flight were journaled as pending,
// the rerun resends them with their keys, and nothing runs twice.
func TestBatchKilledAndRerun(t *testing.T) {
	const n = 60
	// Slow replies keep operations in flight, executed but unanswered,
	// when the kill lands.
	srv := newServer(t, idemtest.Faults{Seed: 5, Slow: 0.4, SlowDelay: 300 * time.Millisecond, DropResponse: 0.1, MaxPerOperation: 1})
	dir := t.TempDir()
	in := writeInput(t, dir, n)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-concurrency", "8", "-progress", "none"}

	cmd, lines, _ := startBinary(t, args...)
	for range 15 {
		require.True(t, lines.Scan(), "the batch ended before the kill")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	killedAt := srv.Snapshot()
	require.Less(t, len(killedAt), n, "the kill came after the end")

	rerun := runBinary(t, nil, args...)

	require.Equal(t, exitOK, rerun.code, rerun.stderr)
	res := results(t, rerun.stdout)
	assertComplete(t, res, n)
	assertOnce(t, srv, n)
	resumed := 0
	for _, r := range res {
		if r.Source == sourceResume {
			resumed++
		}
	}
	assert.Positive(t, resumed, "operations in flight at the kill are resumed with their keys")
}

// SIGINT stops new operations, lets those in flight finish and record
// their outcome, and exits 130; the rerun completes the batch.
func TestBatchInterrupted(t *testing.T) {
	const n = 60
	srv := newServer(t, idemtest.Faults{Seed: 9, Slow: 0.5, SlowDelay: 300 * time.Millisecond, MaxPerOperation: 1})
	dir := t.TempDir()
	in := writeInput(t, dir, n)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-concurrency", "8", "-progress", "none", "-grace", "20s"}

	cmd, lines, stderr := startBinary(t, args...)
	var first []string
	for range 10 {
		require.True(t, lines.Scan(), "the batch ended before the signal")
		first = append(first, lines.Text())
	}
	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	for lines.Scan() {
		first = append(first, lines.Text())
	}
	err := cmd.Wait()

	require.Error(t, err)
	assert.Equal(t, exitInterrupted, cmd.ProcessState.ExitCode(), stderr.String())
	assert.Contains(t, stderr.String(), "starting no new operations")
	res1 := results(t, strings.Join(first, "\n"))
	for op := range srv.Snapshot() {
		if r, ok := res1[op]; assert.True(t, ok, "%s ran but was not reported", op) {
			assert.Equal(t, resultOK, r.Result, "%s was in flight: it finished within the grace period", op)
		}
	}
	fj, err := filejournal.Open(journal, nil)
	require.NoError(t, err)
	pending, err := fj.Pending(context.Background())
	require.NoError(t, err)
	require.NoError(t, fj.Close())
	assert.Empty(t, pending, "every operation in flight recorded its outcome")
	assert.Less(t, len(res1), n, "the signal stopped the batch early")

	rerun := runBinary(t, nil, args...)

	require.Equal(t, exitOK, rerun.code, rerun.stderr)
	assertComplete(t, results(t, rerun.stdout), n)
	assertOnce(t, srv, n)
}

// The in-process version of the signal: the grace period ends, the
// operations still in flight are cancelled and stay pending, and the
// rerun resumes them.
func TestBatchGraceExpires(t *testing.T) {
	const n = 8
	srv := newServer(t, idemtest.Faults{Seed: 1, Slow: 1, SlowDelay: time.Minute, MaxPerOperation: 1})
	dir := t.TempDir()
	in := writeInput(t, dir, n)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-concurrency", "4", "-progress", "none"}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var out outcome
	wg.Go(func() { out = runInProcess(ctx, nil, append(args, "-grace", "50ms")...) })
	require.Eventually(t, func() bool { return srv.Stats().Executions == 4 }, 10*time.Second, 5*time.Millisecond)

	cancel() // the signal
	wg.Wait()

	assert.Equal(t, exitInterrupted, out.code, out.stderr)
	assert.Contains(t, out.stderr, "grace period over")
	res := results(t, out.stdout)
	assert.Len(t, res, 4)
	for _, r := range res {
		assert.Equal(t, resultPending, r.Result)
	}
	assert.Contains(t, out.stderr, "4 pending, 4 not started")

	// Only each operation's first request is slow: the rerun resumes the
	// 4 pending ones, whose retries are fast, and sends the rest.
	rerun := runIn(append(args, "-timeout", "200ms")...)

	require.Equal(t, exitOK, rerun.code, rerun.stderr)
	res = results(t, rerun.stdout)
	assertComplete(t, res, n)
	assertOnce(t, srv, n)
	assert.Equal(t, sourceResume, res[opID(0)].Source)
	assert.Equal(t, sourceRun, res[opID(7)].Source)
}

// recordingProxy forwards to target and records the headers of every
// request it forwards.
func recordingProxy(t *testing.T, target string) (string, func() []http.Header) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	tr := newTransport(8)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = tr
	var mu sync.Mutex
	var seen []http.Header
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		proxy.Close()
		tr.CloseIdleConnections()
	})
	return proxy.URL, func() []http.Header {
		mu.Lock()
		defer mu.Unlock()
		return append([]http.Header(nil), seen...)
	}
}

// Credentials given with -header and -header-env reach the server on
// every request, and never the journal, stdout or stderr.
func TestBatchCredentialsNeverJournaled(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	proxyURL, seen := recordingProxy(t, srv.URL)
	dir := t.TempDir()
	in := writeInput(t, dir, 5)
	journal := filepath.Join(dir, "journal")
	const keySecret = "keysecret_TOPSECRET_3_0123456789"

	out := runBinary(t, []string{"IDEMCTL_TEST_API_KEY=apikey_TOPSECRET_2", "IDEMCTL_TEST_KEY_SECRET=" + keySecret},
		"batch", "-url", proxyURL, "-in", in, "-journal", journal, "-progress", "none",
		"-header", "Authorization: Bearer sk_test_TOPSECRET_1",
		"-header-env", "X-Api-Key=IDEMCTL_TEST_API_KEY",
		"-key-secret-env", "IDEMCTL_TEST_KEY_SECRET")

	require.Equal(t, exitOK, out.code, out.stderr)
	data, err := os.ReadFile(journal)
	require.NoError(t, err)
	assert.Contains(t, string(data), opID(1), "the journal holds the entries in the clear")
	assert.NotContains(t, string(data), "TOPSECRET")
	assert.NotContains(t, out.stdout, "TOPSECRET")
	assert.NotContains(t, out.stderr, "TOPSECRET")
	hs := seen()
	require.Len(t, hs, 5)
	for _, h := range hs {
		assert.Equal(t, "Bearer sk_test_TOPSECRET_1", h.Get("Authorization"))
		assert.Equal(t, "apikey_TOPSECRET_2", h.Get("X-Api-Key"))
	}
	res := results(t, out.stdout)
	for i := range 5 {
		want, err := idemhttp.DeriveKey([]byte(keySecret), opID(i))
		require.NoError(t, err)
		assert.Equal(t, want, res[opID(i)].Key, "-key-secret-env derives the key from the operation id")
	}
	assertOnce(t, srv, 5)
}

func TestBatchMalformedLines(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	give := strings.Join([]string{
		`{"id":"op-000","body":{"amount":1,"currency":"usd","operation":"op-000"}}`,
		`{"id":"op-001","body":{"amount":1,"currency":"usd","operation":"op-001"}`,
		`{"id":"op-002","bdy":{}}`,
		`{"id":"op-000","body":{"amount":2,"currency":"usd","operation":"op-000"}}`,
		`{"id":"op-003","body":{"amount":1,"currency":"usd","operation":"op-003"}}`,
	}, "\n")
	require.NoError(t, os.WriteFile(in, []byte(give), 0o600))

	out := runIn("batch", "-url", srv.URL+"/v1/charges", "-in", in, "-journal", filepath.Join(dir, "j"), "-progress", "none")

	assert.Equal(t, exitInput, out.code, out.stderr)
	assert.Contains(t, out.stderr, "in.jsonl:2: not a JSON object")
	assert.Contains(t, out.stderr, `in.jsonl:3: not a JSON object of id, body, method, path: json: unknown field "bdy"`)
	assert.Contains(t, out.stderr, `in.jsonl:4: id "op-000" already used on line 1`)
	assert.Contains(t, out.stderr, "3 input lines rejected")
	res := results(t, out.stdout)
	assert.Len(t, res, 2)
	assert.Equal(t, map[string]int{"op-000": 1, "op-003": 1}, srv.Snapshot(), "the valid lines ran")
}

// A line whose request changed since it was journaled done is an input
// error with -check-done, which reads done rows' requests back; the
// journaled request stands and is not sent again. (Without -check-done:
// TestBatchChangedDoneLineUnchecked.)
func TestBatchChangedLine(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, 3)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}
	require.Equal(t, exitOK, runIn(args...).code)
	data, err := os.ReadFile(in)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(in, []byte(strings.Replace(string(data), `"amount":101`, `"amount":999`, 1)), 0o600))

	out := runIn(append(args, "-check-done")...)

	assert.Equal(t, exitInput, out.code, out.stderr)
	assert.Contains(t, out.stderr, `in.jsonl:2: operation "op-001" differs`)
	res := results(t, out.stdout)
	assert.True(t, res[opID(1)].Skipped)
	assertOnce(t, srv, 3)
}

func TestBatchUnreachable(t *testing.T) {
	srv := idemtest.NewServer(nil)
	addr := srv.URL
	srv.Close() // nothing listens there now
	dir := t.TempDir()
	in := writeInput(t, dir, 3)
	journal := filepath.Join(dir, "journal")

	out := runIn("batch", "-url", addr, "-in", in, "-journal", journal, "-attempts", "2", "-progress", "none")

	assert.Equal(t, exitUnreachable, out.code, out.stderr)
	assert.Contains(t, out.stderr, "the server was never reached")
	assert.Contains(t, out.stderr, "connection refused")
	res := results(t, out.stdout)
	require.Len(t, res, 3)
	for _, r := range res {
		assert.Equal(t, resultPending, r.Result, "nothing is lost: the keys wait in the journal")
	}
	pending := runIn("pending", "-journal", journal, "-json")
	assert.Equal(t, exitFailed, pending.code)
	assert.Equal(t, 3, strings.Count(pending.stdout, `"state":"pending"`))
}

func TestJournalLocked(t *testing.T) {
	dir := t.TempDir()
	journal := filepath.Join(dir, "journal")
	in := writeInput(t, dir, 1)
	fj, err := filejournal.Open(journal, nil)
	require.NoError(t, err)
	defer fj.Close()
	tests := []struct {
		name string
		give []string
	}{
		{"batch", []string{"batch", "-url", "http://127.0.0.1:1", "-in", in, "-journal", journal}},
		{"resume", []string{"resume", "-journal", journal}},
		{"prune", []string{"prune", "-journal", journal}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runIn(tt.give...)

			assert.Equal(t, exitJournal, out.code)
			assert.Contains(t, out.stderr, "is in use by another process")
		})
	}
}

// Inspection only reads, without the writer's lock: it works while
// another process has the journal open.
func TestJournalLockedInspection(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal")
	fj, err := filejournal.Open(journal, nil)
	require.NoError(t, err)
	defer fj.Close()
	tests := []struct {
		name     string
		give     []string
		wantCode int
	}{
		{"pending", []string{"pending", "-journal", journal}, exitOK},
		{"inspect", []string{"inspect", "-journal", journal, "k"}, exitFailed},
		{"verify", []string{"verify", "-journal", journal}, exitOK},
		{"verify -repair", []string{"verify", "-repair", "-journal", journal}, exitOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runIn(tt.give...)

			assert.Equal(t, tt.wantCode, out.code, out.stderr)
			assert.NotContains(t, out.stderr, "is in use by another process")
		})
	}
}

func TestJournalLockedAcrossProcesses(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal")
	fj, err := filejournal.Open(journal, nil)
	require.NoError(t, err)
	defer fj.Close()

	out := runBinary(t, nil, "prune", "-journal", journal)

	assert.Equal(t, exitJournal, out.code)
	assert.Contains(t, out.stderr, "is in use by another process")
}

// A batch resends what an earlier run left pending: its own operations
// with the input, concurrently; other inputs' entries, and lines changed
// since, through Client.Resume with the journaled request.
func TestBatchResumesEarlierRuns(t *testing.T) {
	srv, endOutage := outageServer(t)
	dir := t.TempDir()
	in := writeInput(t, dir, 6)
	journal := filepath.Join(dir, "journal")
	first := runIn("batch", "-url", srv.URL, "-in", in, "-journal", journal, "-attempts", "1", "-progress", "none")
	require.Equal(t, exitFailed, first.code, first.stderr)
	endOutage()
	// The rerun's input drops op-004 and op-005 and changes op-001.
	data, err := os.ReadFile(in)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	changed := strings.Replace(strings.Join(lines[:4], ""), `"amount":101`, `"amount":999`, 1)
	require.NoError(t, os.WriteFile(in, []byte(changed), 0o600))

	out := runIn("batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none")

	assert.Equal(t, exitInput, out.code, out.stderr)
	assert.Contains(t, out.stderr, `in.jsonl:2: operation "op-001" differs`)
	res := results(t, out.stdout)
	assertComplete(t, res, 6)
	for i := range 6 {
		assert.Equal(t, sourceResume, res[opID(i)].Source, opID(i))
	}
	assert.Equal(t, 0, res[opID(4)].Line, "not in this input")
	assert.Equal(t, 2, res[opID(1)].Line)
	assert.Contains(t, string(res[opID(1)].Response), `"amount":101`, "the journaled request stands")
	assertOnce(t, srv, 6)
}

// An entry pending for longer than the server keeps keys is not resent,
// since the server may have forgotten the key and would run it again: it
// is marked abandoned, reported failed, and left to a person.
func TestBatchExpiredEntryAbandoned(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, 3)
	journal := filepath.Join(dir, "journal")
	ops, bad, err := readInput(strings.NewReader(`{"id":"op-000","path":"/v1/charges","body":{"amount":100,"currency":"usd","operation":"op-000"}}`), mustURL(t, srv.URL))
	require.NoError(t, err)
	require.Empty(t, bad)
	fj, err := filejournal.Open(journal, nil)
	require.NoError(t, err)
	old := time.Now().Add(-25 * time.Hour)
	_, err = fj.Begin(context.Background(), &idemhttp.Entry{
		Operation: opID(0), Key: idemhttp.NewKey(), Method: ops[0].Method, URL: ops[0].URL, Body: ops[0].Body,
		Fingerprint: fingerprint(ops[0]), Created: old, Updated: old, State: idemhttp.StatePending,
	})
	require.NoError(t, err)
	require.NoError(t, fj.Close())
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}

	out := runIn(args...)

	assert.Equal(t, exitFailed, out.code, out.stderr)
	res := results(t, out.stdout)
	assert.Equal(t, resultFailed, res[opID(0)].Result)
	assert.Equal(t, idemhttp.StateAbandoned, res[opID(0)].State)
	assert.Contains(t, res[opID(0)].Error, idemhttp.ErrKeyExpired.Error())
	assert.Equal(t, resultOK, res[opID(1)].Result)
	assert.Equal(t, map[string]int{opID(1): 1, opID(2): 1}, srv.Snapshot(), "the expired operation is not resent")

	again := runIn(args...)

	assert.Equal(t, exitFailed, again.code, again.stderr)
	r := results(t, again.stdout)[opID(0)]
	assert.True(t, r.Skipped)
	assert.Contains(t, r.Error, "abandoned")
}

func TestBatchStdin(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	var stdout, stderr lockedBuffer
	give := `{"id":"op-000","path":"/v1/charges","body":{"amount":100,"currency":"usd","operation":"op-000"}}`

	code := run(t.Context(), []string{"batch", "-url", srv.URL, "-in", "-", "-journal", filepath.Join(dir, "j"), "-progress", "none"}, env{
		stdin:  strings.NewReader(give),
		stdout: &stdout,
		stderr: &stderr,
		getenv: func(string) string { return "" },
	})

	require.Equal(t, exitOK, code, stderr.String())
	assertComplete(t, results(t, stdout.String()), 1)
}

// TestBatchWrongJournalTouchesNothing: a -journal naming the input file,
// or any other file that is not a journal, is refused before anything is
// created or sent: no key file appears beside it, the file is unchanged.
// Before, the key file was created first and the journal refused after.
// Checked: with the key file created before the journal is opened (the
// old order), "another file" fails, and without checkNotInput "the input"
// exits 3 instead of 2.
func TestBatchWrongJournalTouchesNothing(t *testing.T) {
	tests := []struct {
		name     string
		journal  func(dir, in string) string
		wantCode int
		wantErr  string
	}{
		{"the input", func(_, in string) string { return in }, exitUsage, "is the input file (-in)"},
		{"another file", func(dir, _ string) string {
			p := filepath.Join(dir, "results.jsonl")
			require.NoError(t, os.WriteFile(p, []byte(`{"operation":"op-000","result":"ok"}`+"\n"), 0o600))
			return p
		}, exitJournal, "is not an idemhttp journal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t, idemtest.Faults{})
			dir := t.TempDir()
			in := writeInput(t, dir, 3)
			journal := tt.journal(dir, in)
			before := dirContents(t, dir)

			out := runIn("batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none")

			assert.Equal(t, tt.wantCode, out.code, out.stderr)
			assert.Contains(t, out.stderr, tt.wantErr)
			assert.Equal(t, before, dirContents(t, dir), "nothing created or changed")
			assert.NoFileExists(t, journal+".key")
			assert.Zero(t, srv.Stats().Requests, "nothing sent")
		})
	}
}

// dirContents maps each file of dir to its content.
func dirContents(t *testing.T, dir string) map[string]string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	m := map[string]string{}
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(dir, de.Name()))
		require.NoError(t, err)
		m[de.Name()] = string(b)
	}
	return m
}
