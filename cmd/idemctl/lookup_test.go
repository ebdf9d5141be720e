package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingJournal counts the journal calls of a batch that could read
// requests back from the file (Get; Begin, which returns the existing
// entry whole) and its Lookups. batchJournal has no Entries, so the batch
// cannot read every entry through it; beginFails and finishFails make
// those fail.
type countingJournal struct {
	batchJournal
	gets, begins, lookups atomic.Int64
	beginFails            bool
	finishFails           bool
}

func (c *countingJournal) Get(ctx context.Context, key string) (*idemhttp.Entry, error) {
	c.gets.Add(1)
	return c.batchJournal.Get(ctx, key)
}

func (c *countingJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	c.begins.Add(1)
	if c.beginFails {
		return nil, errDiskFull
	}
	return c.batchJournal.Begin(ctx, e)
}

func (c *countingJournal) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	c.lookups.Add(1)
	return c.batchJournal.Lookup(ctx, operation)
}

var errDiskFull = errors.New("disk full (injected)")

// Unwrap returns the journal c wraps, as a caller's wrapper should.
func (c *countingJournal) Unwrap() idemhttp.Journal { return c.batchJournal }

func (c *countingJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	if c.finishFails {
		return errDiskFull
	}
	return c.batchJournal.Finish(ctx, key, o)
}

// runWrapped runs a command line in this process with the journal that
// batch opens wrapped in cj.
func runWrapped(cj *countingJournal, args ...string) outcome {
	var stdout, stderr lockedBuffer
	code := run(context.Background(), args, env{
		stdin:      strings.NewReader(""),
		stdout:     &stdout,
		stderr:     &stderr,
		getenv:     func(string) string { return "" },
		isTerminal: func(io.Writer) bool { return false },
		wrapJournal: func(j batchJournal) batchJournal {
			cj.batchJournal = j
			return cj
		},
	})
	return outcome{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// A rerun of a finished batch decides every row with Lookup, from the
// journal's index: it reads no done row's request back (no Get, no Begin)
// and sends nothing. -check-done reads each one, once.
//
// Checked to fail: with -check-done on by default, gets is 50, not 0.
func TestBatchRerunReadsNoDoneBodies(t *testing.T) {
	const n = 50
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, n)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}
	require.Equal(t, exitOK, runIn(args...).code)
	attempts := srv.Stats().Requests

	var cj countingJournal
	out := runWrapped(&cj, args...)

	assert.Equal(t, exitOK, out.code, out.stderr)
	assert.Zero(t, cj.gets.Load(), "no done row's request read back")
	assert.Zero(t, cj.begins.Load(), "no done row given to Do")
	assert.Equal(t, int64(n), cj.lookups.Load(), "one Lookup per row")
	res := results(t, out.stdout)
	require.Len(t, res, n)
	for id, r := range res {
		assert.True(t, r.Skipped, id)
		assert.Equal(t, sourceJournal, r.Source, id)
		assert.Equal(t, 200, r.Status, id)
		assert.Equal(t, resultOK, r.Result, id)
		assert.NotEmpty(t, r.Key, id)
	}
	assert.Contains(t, out.stderr, "50 done in an earlier run (not sent)")
	assert.Equal(t, attempts, srv.Stats().Requests, "nothing sent")
	assertOnce(t, srv, n)

	var checked countingJournal
	out = runWrapped(&checked, append(args, "-check-done")...)
	assert.Equal(t, exitOK, out.code, out.stderr)
	assert.Equal(t, int64(n), checked.gets.Load(), "-check-done reads each done row once")
	assert.Zero(t, checked.begins.Load())
}

// Without -check-done, a done row whose line changed is reported done and
// not sent (the journaled request stands), without a warning: finding the
// change would mean reading every done row's request back.
func TestBatchChangedDoneLineUnchecked(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, 3)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}
	require.Equal(t, exitOK, runIn(args...).code)
	data, err := os.ReadFile(in)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(in, []byte(strings.Replace(string(data), `"amount":101`, `"amount":999`, 1)), 0o600))

	out := runIn(args...)

	assert.Equal(t, exitOK, out.code, out.stderr)
	assert.NotContains(t, out.stderr, "differs")
	res := results(t, out.stdout)
	assert.True(t, res[opID(1)].Skipped)
	assert.Equal(t, 200, res[opID(1)].Status)
	assertOnce(t, srv, 3)
}

// A journal write that fails under a call stops the run, seen through
// Hooks.OnJournal: no further operation starts, and the exit code says the
// journal failed. A failed Begin also comes back from Do; a failed Finish
// Do only logs.
//
// Checked to fail: with onJournal not set on the client, both exited 1,
// not 3, and "finish" ran all 3.
func TestBatchJournalFailureStops(t *testing.T) {
	tests := []struct {
		name    string
		give    *countingJournal
		wantRan map[string]int
		wantRes string
	}{
		{"begin", &countingJournal{beginFails: true}, map[string]int{}, resultFailed},
		{"finish", &countingJournal{finishFails: true}, map[string]int{opID(0): 1}, resultPending},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t, idemtest.Faults{})
			dir := t.TempDir()
			in := writeInput(t, dir, 3)
			journal := filepath.Join(dir, "journal")

			out := runWrapped(tt.give, "batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none", "-concurrency", "1")

			assert.Equal(t, exitJournal, out.code, out.stderr)
			assert.Contains(t, out.stderr, errDiskFull.Error())
			assert.Equal(t, tt.wantRan, srv.Snapshot(), "nothing started after the failure")
			res := results(t, out.stdout)
			require.Len(t, res, 1, out.stdout)
			assert.Equal(t, tt.wantRes, res[opID(0)].Result)
		})
	}
}
