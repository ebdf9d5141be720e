package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// One JSON vocabulary across commands: batch's results, pending's and
// prune's entries, and prune's record name the same facts alike.
func TestJSONVocabulary(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, 2)
	journal := filepath.Join(dir, "journal")
	batch := runIn("batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none")
	require.Equal(t, exitOK, batch.code, batch.stderr)
	pending := runIn("pending", "-all", "-json", "-journal", journal)
	require.Equal(t, exitOK, pending.code, pending.stderr)
	dry := runIn("prune", "-dry-run", "-json", "-older", "0s", "-journal", journal)
	require.Equal(t, exitOK, dry.code, dry.stderr)

	for name, out := range map[string]string{"batch": batch.stdout, "pending": pending.stdout, "prune": dry.stdout} {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, name)
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &v), name)
		for _, field := range []string{"operation", "key", "state", "status", "attempts"} {
			assert.Contains(t, v, field, "%s: %s", name, lines[0])
		}
		for _, field := range []string{"id", "last_status"} {
			assert.NotContains(t, v, field, "%s: %s", name, lines[0])
		}
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		out := runIn(arg)
		assert.Equal(t, exitOK, out.code)
		assert.Regexp(t, `^idemctl \S+ \(idemhttp .+, go1\.\d+`, out.stdout)
	}
}
