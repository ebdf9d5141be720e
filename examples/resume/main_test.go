package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain doubles as the batch job: run re-executes the test binary, as
// the command re-executes itself, with the child's environment.
func TestMain(m *testing.M) {
	if path := os.Getenv(envJournal); path != "" {
		os.Exit(child(path, os.Getenv(envURL)))
	}
	goleak.VerifyTestMain(m)
}

func TestCrashResumeRerun(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, os.Args[0], &out)
	require.NoError(t, err, out.String())
	t.Log("\n" + out.String())

	assert.Equal(t, 0, rep.Duplicates, "no charge may run twice")
	assert.Equal(t, 0, rep.Lost, "no charge may be lost")
	assert.Equal(t, batchSize, rep.ExecutedOnce)
	assert.Zero(t, rep.ResumeFailed)
	assert.Zero(t, rep.RerunFailed)
	assert.Zero(t, rep.PendingAfterRerun)
	assert.True(t, rep.ok())

	// The child died holding the response it had just received: that
	// charge ran, its entry stayed pending, and Resume got a replay.
	assert.GreaterOrEqual(t, rep.ResumeReplayed, 1)
	assert.Equal(t, rep.JournalPending, rep.Resumed)
	assert.GreaterOrEqual(t, rep.ExecutedAtCrash, crashAt)
	assert.Less(t, rep.ExecutedAtCrash, batchSize, "the crash must come mid-batch")
	// Every operation the child recorded as done, and every one Resume
	// resolved, is done for the rerun: a DoneError, nothing sent.
	assert.Equal(t, rep.JournalDone+rep.Resumed, rep.RerunDone, "done is done: a rerun sends nothing for them")
	assert.Equal(t, batchSize, rep.RerunDone+rep.RerunExecuted)
}
