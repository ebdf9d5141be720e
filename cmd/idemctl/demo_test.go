package main

import (
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// demoArgs is a small demo, without Retry-After waits so it stays fast
// under -race; the faults and the crash are the real ones.
var demoArgs = []string{"demo", "-n", "60", "-concurrency", "6", "-retry-after", "0", "-timeout", "500ms", "-progress", "lines"}

func TestDemo(t *testing.T) {
	out := runIn(demoArgs...)

	require.Equal(t, exitOK, out.code, out.stdout+out.stderr)
	assert.Contains(t, out.stdout, "idemhttp: 0 duplicates, 0 lost: every charge executed exactly once")
	assert.Regexp(t, regexp.MustCompile(`(?m)^ +idemhttp +net/http +retryablehttp +\+ random key +\+ derived key$`), out.stdout)
	assert.Regexp(t, regexp.MustCompile(`(?m)^charges +60 +60 +60 +60 +60$`), out.stdout)
	assert.Regexp(t, regexp.MustCompile(`(?m)^  duplicates +0 +\d+ +\d+ +\d+ +0$`), out.stdout, "a derived key survives the crash")
	assert.Regexp(t, regexp.MustCompile(`(?m)^  lost \(never executed\) +0 +\d+ +\d+ +\d+ +\d+$`), out.stdout)
	assert.Regexp(t, regexp.MustCompile(`the crash left \d+ journal entries pending`), out.stdout)
	assert.Regexp(t, regexp.MustCompile(`(?m)^wall time \(the clients ran at once\): idemhttp \S+, net/http `), out.stdout)
}

// table returns the demo's output without its last line, the wall times:
// the part the seed decides.
func table(t *testing.T, stdout string) string {
	t.Helper()
	i := strings.Index(stdout, "\nwall time")
	require.Positive(t, i, stdout)
	j := strings.Index(stdout[i+1:], "\n")
	require.Positive(t, j, stdout)
	return stdout[:i] + stdout[i+1+j:]
}

// TestDemoSameSeedSameTable: the same seed and flags print the same table,
// byte for byte but the wall times (issue 26: before, the crash was timed
// by the clock and net/http resent keyed requests on dead pooled
// connections by itself, so attempts, requests and duplicates varied from
// run to run). A different seed gives another table. Checked: with
// keep-alives back on (newDemoTransport), this failed three runs in three.
//
// Slow replies are off and the timeout is long: a slow reply is decided by
// the client's timeout, and under -race on a loaded machine a normal reply
// can take 500 ms too (the table is then different, as the flag's help
// says); the other faults and the crash do not depend on time.
func TestDemoSameSeedSameTable(t *testing.T) {
	args := append(append([]string(nil), demoArgs...), "-slow", "0", "-timeout", "3s")
	first := runIn(args...)
	require.Equal(t, exitOK, first.code, first.stderr)
	for range 2 {
		again := runIn(args...)
		require.Equal(t, exitOK, again.code, again.stderr)
		assert.Equal(t, table(t, first.stdout), table(t, again.stdout))
	}
	other := runIn(append(args, "-seed", "2")...)
	require.Equal(t, exitOK, other.code, other.stderr)
	assert.NotEqual(t, table(t, first.stdout), table(t, other.stdout))
}

// TestDemoProgressCountsFailures: each client's last progress line counts
// the charges it saw fail as the table does (issue 26: net/http's line
// said "0 failed" beside a table saying 45). Checked: without the failures
// added to the progress at the end of a column, net/http's line says 0 and
// this fails.
func TestDemoProgressCountsFailures(t *testing.T) {
	out := runIn(demoArgs...)
	require.Equal(t, exitOK, out.code, out.stderr)

	names := []string{"idemhttp", "net/http", "retryablehttp", "+ random key", "+ derived key"}
	failRow := regexp.MustCompile(`(?m)^charges the client saw fail((?: +\d+)+)$`).FindStringSubmatch(out.stdout)
	require.NotNil(t, failRow, out.stdout)
	cells := strings.Fields(failRow[1])
	require.Len(t, cells, len(names))
	sawFailure := false
	for i, name := range names {
		lines := regexp.MustCompile(`(?m)^idemctl demo: `+regexp.QuoteMeta(name)+`: progress (\d+)/(\d+) \(\d+%\): (\d+) ok, (\d+) failed, 0 pending$`).FindAllStringSubmatch(out.stderr, -1)
		require.NotEmpty(t, lines, "%s: %s", name, out.stderr)
		last := lines[len(lines)-1]
		assert.Equal(t, last[2], last[1], "%s: the last line counts every charge", name)
		assert.Equal(t, cells[i], last[4], "%s: failures as in the table", name)
		n, err := strconv.Atoi(cells[i])
		require.NoError(t, err)
		sawFailure = sawFailure || n > 0
	}
	assert.True(t, sawFailure, "some client saw failures, or the test checks nothing")
}

func TestDemoOpsDeaths(t *testing.T) {
	ops := demoOps(10, 6, 4)

	var deaths []death
	for _, op := range ops {
		deaths = append(deaths, op.dies)
	}
	assert.Equal(t, []death{survives, survives, diesUnsent, diesAnswered, diesUnsent, diesAnswered, survives, survives, survives, survives}, deaths,
		"the last 4 of the 6 the first run starts die, alternately")
	assert.Equal(t, `{"amount":1003,"currency":"usd","operation":"charge-0003"}`, string(ops[3].body))
}

// On a terminal the demo shows one bar for all its clients; the bar is
// cleared at the end, so the table stays clean.
func TestDemoProgressBar(t *testing.T) {
	var stdout, stderr lockedBuffer
	code := run(t.Context(), []string{"demo", "-n", "20", "-concurrency", "4", "-retry-after", "0", "-timeout", "500ms"}, env{
		stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
		getenv:     func(string) string { return "" },
		isTerminal: func(io.Writer) bool { return true },
	})

	require.Equal(t, exitOK, code, stderr.String())
	assert.Contains(t, stderr.String(), "charges (5 clients)")
	assert.NotContains(t, stderr.String(), "progress ", "a bar, not lines")
	assert.NotContains(t, stdout.String(), "charges (5 clients)", "the bar stays on stderr")
}
