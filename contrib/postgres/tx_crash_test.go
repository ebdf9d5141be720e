package postgres_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// The crash child: the test binary re-executed with these variables runs
// TestTxCrashChild, a server that SIGKILLs itself at one step of a request.
const (
	crashStepEnv   = "IDEMHTTP_A1_CRASH_STEP"   // the step to die at
	crashModeEnv   = "IDEMHTTP_A1_CRASH_MODE"   // "tx" or "split"
	crashSchemaEnv = "IDEMHTTP_A1_CRASH_SCHEMA" // the test's schema
)

// splitLockTimeout is the split server's lock timeout: how long its
// orphaned claim answers 409 after the crash.
const splitLockTimeout = time.Second

// TestTxCrash kills a server (SIGKILL, a child process) at each step of a
// charge: after the handler's statements, before COMMIT, after COMMIT
// (before any byte of the response is written), and halfway through the
// response. The client then retries with the same key against a fresh
// server until it gets an answer other than 409 or 503. Exactly one
// charge must be committed, the answer must name it, and a further retry
// must replay that answer byte for byte.
//
// The "split" case is the design this replaces: idemserver.Middleware
// with the PostgreSQL Store around a handler that commits its own
// transaction, so the record is written after, and outside, the business
// transaction. Killed between the two commits, it leaves a claim without
// a response; after the lock timeout the retry runs the charge again. The
// test expects the two charges there, which shows that the check above
// fails when the record is not in the business transaction.
//
// Each case logs the recovery time: from the crash to the first answer of
// the retry loop that is not 409 or 503.
func TestTxCrash(t *testing.T) {
	tests := []struct {
		mode, step  string
		wantCharges int
	}{
		{"tx", "handler", 1},
		{"tx", "before-commit", 1},
		{"tx", "after-commit", 1},
		{"tx", "mid-response", 1},
		{"split", "after-commit", 2},
	}
	for _, tt := range tests {
		t.Run(tt.mode+"/"+tt.step, func(t *testing.T) {
			s := newTxSchema(t)
			addr := startCrashChild(t, s, tt.mode, tt.step)
			key := "crash-" + tt.step

			// The first attempt dies with its server.
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/charges", strings.NewReader("amount=1099"))
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			require.Error(t, err, "the server died before its response was complete")
			crashed := time.Now()

			h := crashServer(t, s, tt.mode, nil)
			got, tries := postUntilSettled(t, h, key, "amount=1099")
			recovery := time.Since(crashed)
			ids := charges(t, s, key)
			require.Len(t, ids, tt.wantCharges)
			assert.Equal(t, http.StatusCreated, got.Status)
			if tt.wantCharges == 1 {
				assert.Equal(t, fmt.Sprintf(`{"id":%d}`, ids[0]), got.Body, "the answer names the one charge")
			}
			again := post(t, h, key, "amount=1099")
			assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: got.Body}, again)
			t.Logf("%s killed at %s: recovered after %v (%d tries answered 409/503), %d charge(s)",
				tt.mode, tt.step, recovery.Round(time.Millisecond), tries-1, len(ids))
		})
	}
}

// postUntilSettled retries a request with key until its answer is neither
// 409 nor 503, as a client does, for at most 20 s.
func postUntilSettled(t *testing.T, h http.Handler, key, body string) (reply, int) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(20 * time.Second)
	for tries := 1; ; tries++ {
		got := post(t, h, key, body)
		if got.Status != http.StatusConflict && got.Status != http.StatusServiceUnavailable {
			return got, tries
		}
		require.True(t, time.Now().Before(deadline), "still %d after 20 s", got.Status)
		<-tick.C
	}
}

// startCrashChild starts the crash child and returns its address; the
// child is killed, if it is still alive, when the test ends.
func startCrashChild(t *testing.T, s *testSchema, mode, step string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTxCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashStepEnv+"="+step, crashModeEnv+"="+mode, crashSchemaEnv+"="+s.name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	br := bufio.NewReader(out)
	line, err := br.ReadString('\n')
	exited := make(chan error, 1)
	go func() {
		_, _ = io.Copy(io.Discard, br) // until the child dies
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	require.NoError(t, err, "the child prints its address")
	return strings.TrimSpace(strings.TrimPrefix(line, "addr "))
}

// TestTxCrashChild is the crash child; it skips unless started by
// startCrashChild.
func TestTxCrashChild(t *testing.T) {
	step := os.Getenv(crashStepEnv)
	if step == "" {
		t.Skip("the crash child of TestTxCrash")
	}
	s := &testSchema{url: serverURL(t), name: os.Getenv(crashSchemaEnv)}
	die := func(at string) {
		if at == step {
			// os.Process.Kill is SIGKILL on Unix (and builds on Windows).
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Kill()
			}
			select {} // the signal is on its way
		}
	}
	h := crashServer(t, s, os.Getenv(crashModeEnv), die)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fmt.Printf("addr %s\n", ln.Addr())
	_ = http.Serve(ln, h) // until killed
}

// crashServer is the charge server of TestTxCrash; die, when not nil, is
// called at each step.
func crashServer(t testing.TB, s *testSchema, mode string, die func(string)) http.Handler {
	t.Helper()
	if mode == "split" {
		// The record after, and outside, the business transaction.
		pool := s.pool(t, 4)
		mw := &idemserver.Middleware{Store: newStore(t, pool), LockTimeout: splitLockTimeout, Logger: discardLogger(), SingleTenant: true}
		return mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
				return chargeTx(w, r, tx)
			})
			if err == nil && die != nil {
				die("after-commit")
			}
		}))
	}
	m := newTx(t, s, 4, &postgres.TxOptions{Logger: discardLogger()})
	if die != nil {
		postgres.SetTxStepHook(m, die)
	}
	return m.WrapFunc(chargeTx)
}
