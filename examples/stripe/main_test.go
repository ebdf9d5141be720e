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

// A stripe-go batch SIGKILLed half-way and rerun charges each row exactly
// once, counted by the server. Checked once to fail without WithOperation
// (each call then goes under the fresh key stripe-go mints): 30 of the 60
// charges ran twice.
func TestStripeBatchKilledAndRerun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, os.Args[0], &out)
	require.NoError(t, err, out.String())
	t.Log("\n" + out.String())

	assert.Positive(t, rep.ExecutedAtCrash, "the crash came after some charges")
	assert.Less(t, rep.ExecutedAtCrash, batchSize, "the crash came before the end")
	assert.Positive(t, rep.RerunDone, "charges done before the crash are skipped: done is done")
	assert.Equal(t, batchSize, rep.RerunDone+rep.RerunReplayed+rep.RerunExecuted)
	assert.Equal(t, 0, rep.Duplicates, "no charge may run twice")
	assert.Equal(t, 0, rep.Lost, "no charge may be lost")
	assert.Zero(t, rep.RerunFailed)
	assert.Equal(t, batchSize, rep.ExecutedOnce)
}
