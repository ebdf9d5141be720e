package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The crash tests run this test binary again as a child that sends a batch
// of operations through a FileJournal and is SIGKILLed at a chosen point.
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
)

// killJournal wraps the child's journal and kills the process at a point.
type killJournal struct {
	Journal
	point string
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; never return
}

func isVictim(e *Entry) bool { return e.Operation == crashOpID(crashVictim) }

func (k killJournal) Begin(ctx context.Context, e *Entry) (*Entry, error) {
	if k.point == crashBeforeEntry && isVictim(e) {
		die()
	}
	old, err := k.Journal.Begin(ctx, e)
	if k.point == crashAfterEntry && isVictim(e) {
		die()
	}
	return old, err
}

func (k killJournal) Finish(ctx context.Context, key string, o Outcome) error {
	if k.point == crashBeforeFinish {
		if e, err := k.Journal.Get(ctx, key); err == nil && isVictim(e) {
			die()
		}
	}
	return k.Journal.Finish(ctx, key, o)
}

func crashOpID(i int) string { return "op-" + strconv.Itoa(i) }

func crashBody(i int) string { return fmt.Sprintf(`{"operation":%q,"amount":%d}`, crashOpID(i), 100+i) }

// runBatch sends every operation once, in order, as a batch job does.
func runBatch(t testing.TB, c *Client, url string) map[string]int {
	statuses := map[string]int{}
	for i := range crashOps {
		ctx := WithOperation(context.Background(), crashOpID(i))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(crashBody(i)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
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
	fj, err := OpenFileJournal(os.Getenv(crashEnvJournal), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{Journal: killJournal{Journal: fj, point: point}, Policy: &Policy{BaseDelay: time.Millisecond}}
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
	for _, point := range []string{crashBeforeEntry, crashAfterEntry, crashAfterCommit, crashBeforeFinish} {
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
			fj, err := OpenFileJournal(path, nil)
			require.NoError(t, err)
			defer fj.Close()
			c := &Client{Journal: fj, Policy: &Policy{BaseDelay: time.Millisecond}}
			results, err := c.Resume(context.Background())
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
