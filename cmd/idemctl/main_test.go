package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// binDir holds the idemctl binary the end-to-end tests run, built once per
// test process on first use (building it per test would cost a link each)
// and removed when the tests end.
var binDir string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(withBinDir{m})
}

// withBinDir creates binDir around the tests and removes it after.
type withBinDir struct{ m *testing.M }

func (w withBinDir) Run() int {
	dir, err := os.MkdirTemp("", "idemctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	return w.m.Run()
}

var buildBinary = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(binDir, "idemctl")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		// The binary runs the same code as the in-process tests, under
		// signals and kills: worth checking for races too.
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// binary returns the path of the built idemctl.
func binary(t *testing.T) string {
	t.Helper()
	bin, err := buildBinary()
	require.NoError(t, err)
	return bin
}

// outcome is what a command run left.
type outcome struct {
	code   int
	stdout string
	stderr string
}

// lockedBuffer is a bytes.Buffer safe for the writes of several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runInProcess runs a command line in this process with environ as the
// whole environment.
func runInProcess(ctx context.Context, environ map[string]string, args ...string) outcome {
	var stdout, stderr lockedBuffer
	code := run(ctx, args, env{
		stdin:      strings.NewReader(""),
		stdout:     &stdout,
		stderr:     &stderr,
		getenv:     func(k string) string { return environ[k] },
		isTerminal: func(io.Writer) bool { return false },
	})
	return outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// runIn is runInProcess without a context or environment.
func runIn(args ...string) outcome {
	return runInProcess(context.Background(), nil, args...)
}

// runBinary runs the built binary to completion.
func runBinary(t *testing.T, environ []string, args ...string) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(os.Environ(), environ...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// startBinary starts the binary and returns it with a reader of its
// stdout lines; the caller waits for it.
func startBinary(t *testing.T, args ...string) (*exec.Cmd, *bufio.Scanner, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return cmd, sc, &stderr
}

// results parses result lines, by operation id.
func results(t *testing.T, lines ...string) map[string]result {
	t.Helper()
	out := map[string]result{}
	for _, text := range lines {
		for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
			if l == "" {
				continue
			}
			var r result
			require.NoError(t, json.Unmarshal([]byte(l), &r), l)
			out[r.ID] = r
		}
	}
	return out
}

// opID names the i-th operation of the test inputs.
func opID(i int) string { return fmt.Sprintf("op-%03d", i) }

// writeInput writes n charge operations; each body names its operation,
// so the fake API counts executions per operation.
func writeInput(t *testing.T, dir string, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"id":%q,"path":"/v1/charges","body":{"amount":%d,"currency":"usd","operation":%q}}`+"\n", opID(i), 100+i, opID(i))
	}
	path := filepath.Join(dir, "in.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}
