package filejournal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The crash tests run this test binary again as a child that sends a batch
// of operations through a Journal and is SIGKILLed at a chosen point.
// The parent then reopens the journal, resumes, reruns the batch as a
// batch job would, and counts executions on the server.

const (
	crashEnvPoint   = "IDEMHTTP_CRASH_POINT"
	crashEnvJournal = "IDEMHTTP_CRASH_JOURNAL"
	crashEnvURL     = "IDEMHTTP_CRASH_URL"
	crashOps        = 6
	crashVictim     = 3 // the operation during which the child dies
)

// The points where a process can die around one request.
const (
	crashBeforeEntry  = "before-entry"  // Begin not yet called
	crashAfterEntry   = "after-entry"   // entry durable, nothing sent
	crashAfterCommit  = "after-commit"  // the server ran the effect, the response is not read
	crashBeforeFinish = "before-finish" // response read, done not recorded
	crashAfterFinish  = "after-finish"  // Finish returned; its record is written behind and may not be on disk
)

// killJournal wraps the child's journal and kills the process at a point.
type killJournal struct {
	idemhttp.Journal
	point string
}

func die() {
	// os.Process.Kill is SIGKILL on Unix, TerminateProcess on Windows:
	// the process ends at once, nothing deferred runs.
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {} // never return
}

func isVictim(e *idemhttp.Entry) bool { return e.Operation == crashOpID(crashVictim) }

func (k killJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	if k.point == crashBeforeEntry && isVictim(e) {
		die()
	}
	old, err := k.Journal.Begin(ctx, e)
	if k.point == crashAfterEntry && isVictim(e) {
		die()
	}
	return old, err
}

func (k killJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	if k.point == crashBeforeFinish {
		if e, err := k.Journal.Get(ctx, key); err == nil && isVictim(e) {
			die()
		}
	}
	err := k.Journal.Finish(ctx, key, o)
	if k.point == crashAfterFinish {
		if e, gerr := k.Journal.Get(ctx, key); gerr == nil && isVictim(e) {
			die()
		}
	}
	return err
}

func crashOpID(i int) string { return "op-" + strconv.Itoa(i) }

func crashBody(i int) string { return fmt.Sprintf(`{"operation":%q,"amount":%d}`, crashOpID(i), 100+i) }

// runBatch sends every operation once, in order, as a batch job does.
func runBatch(t testing.TB, c *idemhttp.Client, url string) map[string]int {
	statuses := map[string]int{}
	for i := range crashOps {
		ctx := idemhttp.WithOperation(context.Background(), crashOpID(i))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(crashBody(i)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		var done *idemhttp.DoneError
		if errors.As(err, &done) {
			statuses[crashOpID(i)] = done.Status // done is done: nothing sent
			continue
		}
		if err != nil {
			statuses[crashOpID(i)] = -1
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses[crashOpID(i)] = resp.StatusCode
	}
	return statuses
}

// TestCrashChild is the child's body; it does nothing in a normal run.
func TestCrashChild(t *testing.T) {
	point := os.Getenv(crashEnvPoint)
	if point == "" {
		t.Skip("run by TestCrashAndResume as a child process")
	}
	fj, err := Open(os.Getenv(crashEnvJournal), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &idemhttp.Client{Journal: killJournal{Journal: fj, point: point}, Policy: &idemhttp.Policy{BaseDelay: time.Millisecond}}
	runBatch(t, c, os.Getenv(crashEnvURL))
	_ = fj.Close()
}

// dedupServer is a minimal server half: it runs each key's effect once and
// replays the stored answer afterwards, counting effects per operation.
type dedupServer struct {
	mu       sync.Mutex
	done     map[string]string // key -> stored body
	effects  map[string]int    // operation -> executions
	onCommit func(op string)   // called after the effect is stored, before answering
}

func (s *dedupServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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

func (s *dedupServer) Effects() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.effects {
		out[k] = v
	}
	return out
}

func TestCrashAndResume(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	for _, point := range []string{crashBeforeEntry, crashAfterEntry, crashAfterCommit, crashBeforeFinish, crashAfterFinish} {
		t.Run(point, func(t *testing.T) {
			srv := &dedupServer{done: map[string]string{}, effects: map[string]int{}}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			path := filepath.Join(t.TempDir(), "journal.db")

			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), crashEnvPoint+"="+point, crashEnvJournal+"="+path, crashEnvURL+"="+ts.URL)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			child := make(chan *os.Process, 1)
			if point == crashAfterCommit {
				srv.mu.Lock()
				srv.onCommit = func(op string) {
					if op == crashOpID(crashVictim) {
						_ = (<-child).Kill() // SIGKILL, after the effect is stored
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

			// The restart: reopen the journal, resume, rerun the batch.
			fj, err := Open(path, nil)
			require.NoError(t, err)
			defer fj.Close()
			c := &idemhttp.Client{Journal: fj, Policy: &idemhttp.Policy{BaseDelay: time.Millisecond}}
			results, err := c.Resume(context.Background(), nil)
			require.NoError(t, err)
			for _, r := range results {
				assert.NoError(t, r.Err, "resume %s", r.Entry.Operation)
			}
			statuses := runBatch(t, c, ts.URL)

			effects := srv.Effects()
			for i := range crashOps {
				op := crashOpID(i)
				assert.Equal(t, 1, effects[op], "%s must run exactly once", op)
				assert.Equal(t, http.StatusOK, statuses[op], "%s must end ok", op)
			}
			pending, err := fj.Pending(context.Background())
			require.NoError(t, err)
			assert.Empty(t, pending)
		})
	}
}

const crashEnvStorm = "IDEMHTTP_CRASH_STORM"

// TestCrashStormChild is the child of TestCrashMidCommit: 16 goroutines
// begin and finish entries as fast as the journal takes them, printing
// each key once its Begin has returned, until the parent kills the
// process.
func TestCrashStormChild(t *testing.T) {
	path := os.Getenv(crashEnvStorm)
	if path == "" {
		t.Skip("run by TestCrashMidCommit as a child process")
	}
	fj, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("storm-%02d-%06d", g, i)
				e := &idemhttp.Entry{Key: key, Method: http.MethodPost, URL: "http://127.0.0.1/x", Body: bytes.Repeat([]byte{'x'}, 100+i%900)}
				if _, err := fj.Begin(context.Background(), e); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				_, _ = os.Stdout.WriteString(key + "\n") // unbuffered: what was printed survives the kill
				mu.Unlock()
				if err := fj.Finish(context.Background(), key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// A process killed while group commits are in flight leaves a journal
// that opens without error and holds every entry whose Begin returned.
func TestCrashMidCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	for round := range 3 {
		path := filepath.Join(t.TempDir(), "journal.db")
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashStormChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnvStorm+"="+path)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		// Kill once a number of Begins that varies with the round have
		// been acknowledged: commits are in flight at any such point.
		killAt := 300 * (round + 1)
		reached := make(chan struct{})
		ackedCh := make(chan []string, 1)
		go func() {
			var acked []string
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if l := sc.Text(); strings.HasPrefix(l, "storm-") {
					acked = append(acked, l)
					if len(acked) == killAt {
						close(reached)
					}
				}
			}
			ackedCh <- acked
		}()
		select {
		case <-reached:
		case <-time.After(30 * time.Second):
			t.Fatal("the child never reached the kill point")
		}
		require.NoError(t, cmd.Process.Kill())
		acked := <-ackedCh // the pipe ends when the child is gone
		_ = cmd.Wait()
		require.NotEmpty(t, acked, "the child acknowledged no Begin before the kill")

		fj, err := Open(path, nil)
		require.NoError(t, err, "round %d", round)
		require.NoError(t, fj.Verify(context.Background()))
		for _, k := range acked {
			_, err := fj.Get(context.Background(), k)
			assert.NoError(t, err, "acknowledged Begin %s lost", k)
		}
		t.Logf("round %d: %d acknowledged Begins, all present; %d bytes cut off", round, len(acked), fj.Stats().TruncatedBytes)
		require.NoError(t, fj.Close())
	}
}
