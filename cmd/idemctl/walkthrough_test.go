package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/needs"
)

// walkthroughScript returns the sh blocks of the README's walkthrough,
// between its markers, as one script.
func walkthroughScript(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	s := string(readme)
	start := strings.Index(s, "<!-- walkthrough:")
	end := strings.Index(s, "<!-- end walkthrough -->")
	require.True(t, start >= 0 && end > start, "README.md has no walkthrough markers")
	var script strings.Builder
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(s[start:end], -1) {
		script.WriteString(m[1])
	}
	require.NotEmpty(t, script.String())
	return script.String()
}

// freePort returns a port that was free a moment ago: the walkthrough
// names its port, as a person would, and the test gives it one the
// system chose rather than a fixed one.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestWalkthrough runs the README's walkthrough for real, with the built
// binary as ./idemctl: idemctl serve in the background, a batch SIGKILLed
// (kill -9) once 60 charges are done, pending, inspect and verify on the
// journal it left, resume, two reruns, and the server's counts when it
// stops: every charge executed exactly once. Checked: with the script
// given an extra rerun on a fresh journal with -random-keys (a job that
// lost its journal), the server counts 200 duplicates and this fails.
func TestWalkthrough(t *testing.T) {
	if runtime.GOOS == "windows" {
		needs.Missing(t, "a POSIX shell: the walkthrough is a shell script", "go test -race -count=1 -run 'TestWalkthrough$' {pkg} on Linux or macOS")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		needs.Missing(t, "bash: not found", "go test -race -count=1 -run 'TestWalkthrough$' {pkg} with bash installed")
	}
	dir := t.TempDir()
	require.NoError(t, os.Symlink(binary(t), filepath.Join(dir, "idemctl")))
	script := walkthroughScript(t)
	require.Contains(t, script, "PORT=8787")
	script = strings.Replace(script, "PORT=8787", "PORT="+strconv.Itoa(freePort(t)), 1)

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	setProcessGroup(cmd) // so that a failure leaves no server behind
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { killProcessGroup(cmd) })
	err := cmd.Wait()
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err, name)
		return string(b)
	}

	run1 := results(t, read("run1.jsonl"))
	assert.GreaterOrEqual(t, len(run1), 60)
	assert.Less(t, len(run1), 200, "the batch was killed mid-way")
	assert.Contains(t, stderr.String(), "Killed", "kill -9")
	resumed := results(t, read("resumed.jsonl"))
	assert.NotEmpty(t, resumed, "the kill left charges pending, and resume resent them")
	for id, r := range resumed {
		assert.Equal(t, resultOK, r.Result, id)
		assert.Nil(t, run1[id].Response, "%s: a resumed charge had not been reported", id)
	}
	assert.Regexp(t, `(?m)^charge-\d{3} +\S+ +POST +http://127\.0\.0\.1:\d+/v1/charges +\S+ +\? +- +pending$`, stdout.String(), "pending lists them with ? attempts")
	assert.Regexp(t, `(?m)^state +done$`, stdout.String(), "inspect")
	assert.Regexp(t, `(?m)^state +healthy$`, stdout.String(), "verify")
	assert.Regexp(t, `(?m)^entries +\d+ pending, \d+ done, 0 abandoned$`, stdout.String(), "verify")

	run2 := results(t, read("run2.jsonl"))
	require.Len(t, run2, 200)
	for id, r := range run2 {
		assert.Equal(t, resultOK, r.Result, id)
	}
	run3 := results(t, read("run3.jsonl"))
	require.Len(t, run3, 200)
	for id, r := range run3 {
		assert.True(t, r.Skipped, "%s: the third run sends nothing", id)
	}

	last := strings.TrimSpace(read("serve.log"))
	last = last[strings.LastIndex(last, "\n")+1:]
	assert.Contains(t, last, "idemctl serve: stopped after")
	assert.Contains(t, last, " executions=200 operations=200 duplicates=0 ", "every charge executed exactly once")
	assert.Regexp(t, ` drop-response=[1-9]\d* `, last, "answers were lost")
}
