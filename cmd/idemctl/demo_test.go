package main

import (
	"context"
	"io"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDemo(t *testing.T) {
	// Small and without Retry-After waits, so it stays fast under -race;
	// the faults and the crash are the real ones.
	out := runIn("demo", "-n", "60", "-concurrency", "6", "-retry-after", "0", "-timeout", "500ms")

	require.Equal(t, exitOK, out.code, out.stdout+out.stderr)
	assert.Contains(t, out.stdout, "idemhttp: 0 duplicates, 0 lost: every charge executed exactly once")
	assert.Regexp(t, regexp.MustCompile(`(?m)^ +idemhttp +net/http +go-retryablehttp +go-retryablehttp \+ Idempotency-Key$`), out.stdout)
	assert.Regexp(t, regexp.MustCompile(`(?m)^charges +60 +60 +60 +60$`), out.stdout)
	assert.Regexp(t, regexp.MustCompile(`(?m)^  duplicates +0 +\d+ +\d+ +\d+$`), out.stdout)
	assert.Regexp(t, regexp.MustCompile(`(?m)^  lost \(never executed\) +0 +\d+ +\d+ +\d+$`), out.stdout)
	// Not a terminal: plain progress lines, one per column at least.
	assert.GreaterOrEqual(t, strings.Count(out.stderr, "idemctl: progress "), 4, out.stderr)
	assert.Regexp(t, regexp.MustCompile(`the crash left \d+ journal entries pending`), out.stdout)
}

func TestDemoPoolCrash(t *testing.T) {
	ops := demoOps(50)
	crashed := 0

	ok := pool(t.Context(), ops, 1, 10, func() { crashed++ }, func(context.Context, demoOp) bool { return true })

	assert.Equal(t, 1, crashed)
	assert.Equal(t, 10, countTrue(ok), "with one worker, the crash stops the run right after the 10th charge")
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// On a terminal the demo shows the batch's bar; the bar is cleared at the
// end of each column, so the table stays clean.
func TestDemoProgressBar(t *testing.T) {
	var stdout, stderr lockedBuffer
	code := run(t.Context(), []string{"demo", "-n", "20", "-concurrency", "4", "-retry-after", "0", "-timeout", "500ms"}, env{
		stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
		getenv:     func(string) string { return "" },
		isTerminal: func(io.Writer) bool { return true },
	})

	require.Equal(t, exitOK, code, stderr.String())
	assert.Contains(t, stderr.String(), "operations")
	assert.NotContains(t, stderr.String(), "idemctl: progress ", "a bar, not lines")
	assert.NotContains(t, stdout.String(), "operations", "the bar stays on stderr")
}
