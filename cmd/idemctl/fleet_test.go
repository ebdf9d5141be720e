package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/internal/needs"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fleetDSN returns the URL of a schema of its own on the test database
// (IDEMHTTP_POSTGRES_URL), dropped when the test ends, or skips (fails
// on CI; see internal/needs).
func fleetDSN(t *testing.T) string {
	t.Helper()
	base := os.Getenv("IDEMHTTP_POSTGRES_URL")
	if base == "" {
		needs.Missing(t, "PostgreSQL: IDEMHTTP_POSTGRES_URL is not set", needs.Services)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "idemctl_fleet_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, base)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// startServe starts idemctl serve -json with args as a child and returns
// its URL, and a function that stops it with SIGTERM and returns its last
// counts.
func startServeBinary(t *testing.T, args ...string) (string, func() serveStats) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, binary(t), append([]string{"serve", "-json"}, args...)...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer // read while serve still writes it
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	sc := bufio.NewScanner(out)
	require.True(t, sc.Scan(), "serve printed nothing: %s", stderr.String())
	var first struct{ URL string }
	require.NoError(t, json.Unmarshal(sc.Bytes(), &first))
	return first.URL, func() serveStats {
		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		var last serveStats
		for sc.Scan() {
			require.NoError(t, json.Unmarshal(sc.Bytes(), &last), sc.Text())
		}
		require.NoError(t, cmd.Wait(), stderr.String())
		return last
	}
}

// worker is one idemctl batch of the fleet.
type worker struct {
	cmd     *exec.Cmd
	lines   chan result // its result lines, closed at EOF
	stderr  *lockedBuffer
	results []result
}

func startWorker(t *testing.T, environ []string, args ...string) *worker {
	t.Helper()
	// A deadline, so that a fleet that never finishes fails the test
	// instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w := &worker{cmd: exec.CommandContext(ctx, binary(t), args...), lines: make(chan result, 1024), stderr: &lockedBuffer{}}
	w.cmd.Env = append(os.Environ(), environ...)
	w.cmd.Stderr = w.stderr
	out, err := w.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, w.cmd.Start())
	t.Cleanup(func() {
		if w.cmd.ProcessState == nil {
			_ = w.cmd.Process.Kill()
			_ = w.cmd.Wait()
		}
	})
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r result
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				w.lines <- r
			}
		}
	}()
	return w
}

// wait collects the worker's results and returns its exit code.
func (w *worker) wait(t *testing.T) int {
	t.Helper()
	for r := range w.lines {
		w.results = append(w.results, r)
	}
	err := w.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// TestFleet runs one batch on three idemctl processes sharing a
// PostgreSQL journal, against idemctl serve losing some answers, and
// SIGKILLs one of them mid-way: the two others load the same input (each
// operation's entry once), work through it with leases, resend the dead
// worker's entries once its leases end, and finish; the server executed
// every operation exactly once. Checked: with runFleetBatch sending each
// pending operation of the input itself (Lookup, then Do) instead of the
// entries ClaimPending leases it, both survivors send the same operations
// (dozens "sent by 2 surviving workers"), and the one whose lease the
// other took reports them pending.
func TestFleet(t *testing.T) {
	dsn := fleetDSN(t)
	srvURL, stopServe := startServeBinary(t, "-seed", "3", "-drop-response", "0.05", "-latency", "5ms")
	dir := t.TempDir()
	const n = 300
	in := writeInput(t, dir, n)
	environ := []string{"IDEMCTL_KEY_SECRET=fleet-test-secret-0123456789"}
	args := func(name string) []string {
		return []string{"batch", "-url", srvURL, "-in", in, "-journal", dsn, "-concurrency", "4", "-rate", "40",
			"-lease", "2s", "-worker", name, "-progress", "none"}
	}

	victim := startWorker(t, environ, args("victim")...)
	for range 20 { // the victim has sent some and holds leases on more
		_, ok := <-victim.lines
		require.True(t, ok, "the victim ended early: %s", victim.stderr.String())
	}
	survivors := []*worker{startWorker(t, environ, args("w2")...), startWorker(t, environ, args("w3")...)}
	require.NoError(t, victim.cmd.Process.Kill())
	victim.wait(t)

	reported := map[string]int{}
	for _, w := range survivors {
		code := w.wait(t)
		assert.Equal(t, exitOK, code, w.stderr.String())
		assert.Contains(t, w.stderr.String(), fmt.Sprintf("the journal, all workers: %d operations of the input: %d ok, 0 failed, 0 pending", n, n))
		for _, r := range w.results {
			assert.Equal(t, resultOK, r.Result, "%s: %s", r.ID, r.Error)
			if r.Source != sourceJournal {
				reported[r.ID]++
			}
		}
	}
	st := stopServe()

	assert.Equal(t, n, st.Executions, "every operation executed once")
	assert.Equal(t, n, st.Operations)
	assert.Zero(t, st.Duplicates)
	assert.Positive(t, st.Faults["drop-response"], "answers were lost")
	for id, k := range reported {
		assert.Equal(t, 1, k, "%s was sent by %d surviving workers", id, k)
	}
	// Besides the retries of lost answers, each operation went out once,
	// but for the few the victim was sending when it died.
	assert.LessOrEqual(t, st.Requests, n+st.Faults["drop-response"]+4, "requests")

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	j := postgres.NewJournal(pool, nil)
	for i := range n {
		en, err := j.Lookup(ctx, opID(i))
		require.NoError(t, err)
		assert.Equal(t, idemhttp.StateDone, en.State, opID(i))
	}
}

// TestFleetResume: resume on a shared journal claims and resends what a
// killed batch left pending (the operations it had loaded and not sent,
// and, once their leases end, those it was sending), with their stored
// requests, and the server executes each once. Checked: with
// runFleetResume's accept refusing every entry, nothing is resent (10
// executions of 50) and it exits 1.
func TestFleetResume(t *testing.T) {
	dsn := fleetDSN(t)
	srvURL, stopServe := startServeBinary(t, "-latency", "5ms")
	const n = 50
	in := writeInput(t, t.TempDir(), n)
	environ := []string{"IDEMCTL_KEY_SECRET=fleet-test-secret-0123456789"}
	victim := startWorker(t, environ, "batch", "-url", srvURL, "-in", in, "-journal", dsn, "-concurrency", "2", "-rate", "20", "-lease", "1s", "-progress", "none")
	for range 10 {
		_, ok := <-victim.lines
		require.True(t, ok, "the victim ended early: %s", victim.stderr.String())
	}
	require.NoError(t, victim.cmd.Process.Kill())
	victim.wait(t)

	resume := startWorker(t, nil, "resume", "-journal", dsn, "-lease", "1s", "-progress", "none")
	code := resume.wait(t)
	st := stopServe()

	assert.Equal(t, exitOK, code, resume.stderr.String())
	assert.GreaterOrEqual(t, len(resume.results), n-10)
	assert.Equal(t, n, st.Executions)
	assert.Equal(t, n, st.Operations)
	assert.Zero(t, st.Duplicates)
}

// TestFleetUsage: a shared journal needs a secret every machine shares,
// or random keys; -lease and -worker only apply to one; and the URL's
// password never shows in a message.
func TestFleetUsage(t *testing.T) {
	in := writeInput(t, t.TempDir(), 1)
	tests := []struct {
		name string
		give []string
		env  map[string]string
		want string
	}{
		{"no secret", []string{"batch", "-url", "http://127.0.0.1:1", "-in", in, "-journal", "postgres://u:hunter2@127.0.0.1:1/db"}, nil,
			"with a postgres:// journal, keys are derived from the secret in IDEMCTL_KEY_SECRET"},
		{"lease on a file", []string{"batch", "-url", "http://127.0.0.1:1", "-in", in, "-journal", filepath.Join(t.TempDir(), "j"), "-lease", "1s"}, nil,
			"-lease applies only to a postgres:// journal"},
		{"unreachable", []string{"resume", "-journal", "postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=1"}, nil,
			"journal postgres://u:xxxxx@127.0.0.1:1/db"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runInProcess(context.Background(), tt.env, tt.give...)

			assert.NotEqual(t, exitOK, out.code)
			assert.Contains(t, out.stderr, tt.want)
			assert.NotContains(t, out.stderr+out.stdout, "hunter2")
		})
	}
}

// TestFleetHandsBackOtherBatches (issue 31 §1.10): a batch on a shared
// journal that claims entries of another batch hands them back unsent
// and unchanged: no lease kept (another batch's worker claims them at
// once) and their last status and attempts as they were; and it still
// reaches its own operations, behind twenty foreign ones. Checked to fail
// with claimAll handing them back with Finish(pending) (as before): the
// foreign entries stayed leased to the batch for its -lease, and their
// last status 503 became 0.
func TestFleetHandsBackOtherBatches(t *testing.T) {
	dsn := fleetDSN(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, postgres.Migrate(ctx, pool))
	other := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "other-batch"})
	const foreign = 20
	for i := range foreign {
		key := fmt.Sprintf("other-key-%02d", i)
		_, err := other.Enqueue(ctx, &idemhttp.Entry{Operation: fmt.Sprintf("other-%02d", i), Key: key, Method: "POST",
			URL: "http://127.0.0.1:1/v1/other", Fingerprint: "fp-other", State: idemhttp.StatePending})
		require.NoError(t, err)
		require.NoError(t, other.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StatePending, Status: 503, Attempts: 1}))
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"id":"ch_1"}`)
	}))
	defer srv.Close()
	in := writeInput(t, t.TempDir(), 3)
	out := runInProcess(ctx, map[string]string{"IDEMCTL_KEY_SECRET": "fleet-test-secret-0123456789"},
		"batch", "-url", srv.URL, "-in", in, "-journal", dsn, "-concurrency", "2", "-lease", "1h", "-progress", "none")
	require.Equal(t, exitOK, out.code, out.stderr)
	assert.Contains(t, out.stderr, "3 operations of the input: 3 ok")

	claimer := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "other-batch-2"})
	claimed, err := claimer.ClaimPending(ctx, 100)
	require.NoError(t, err)
	assert.Len(t, claimed, foreign, "another batch's worker claims every one at once")
	for _, en := range claimed {
		e, err := claimer.Get(ctx, en.Key)
		require.NoError(t, err)
		assert.Equal(t, 503, e.LastStatus, "%s: its last status kept", e.Key)
		assert.Equal(t, 1, e.Attempts, e.Key)
	}
}
