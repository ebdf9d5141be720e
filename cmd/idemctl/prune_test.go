package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Issue 15: "prune -older 1s and then a rerun of the batch produced 100
// duplicate charges with exit 0". Random keys make the worst case: the
// rerun mints new keys for the pruned operations, so the server runs all of
// them again. Now prune records what it deleted and the rerun refuses
// before sending anything. Checked once to fail with the record ignored
// (checkPruned returning ops unchanged): 100 duplicates, exit 0.
func TestPruneThenRerunRefused(t *testing.T) {
	const n = 100
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, n)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none", "-concurrency", "16", "-random-keys"}
	require.Equal(t, exitOK, runIn(args...).code)

	pruned := runIn("prune", "-journal", journal, "-older", "0s")
	require.Equal(t, exitOK, pruned.code, pruned.stderr)
	assert.Contains(t, pruned.stderr, "pruned 100 entries")
	requests := srv.Stats().Requests

	rerun := runIn(args...)

	assert.Equal(t, exitRefused, rerun.code, rerun.stderr)
	assert.Contains(t, rerun.stderr, "100 input operations were pruned from the journal")
	assert.Contains(t, rerun.stderr, "Nothing was sent")
	assert.Empty(t, rerun.stdout)
	assert.Equal(t, requests, srv.Stats().Requests, "nothing is sent")
	assertOnce(t, srv, n)

	skip := runIn(append(args, "-pruned", "skip")...)

	assert.Equal(t, exitOK, skip.code, skip.stderr)
	res := results(t, skip.stdout)
	assertComplete(t, res, n)
	assert.Equal(t, sourcePruned, res[opID(7)].Source)
	assert.True(t, res[opID(7)].Skipped)
	assert.Equal(t, 200, res[opID(7)].Status)
	assert.Equal(t, requests, srv.Stats().Requests, "skip sends nothing")
}

// With derived keys (the default), -pruned send resends the pruned
// operations under the same keys, and the server replays them.
func TestPruneThenSendDerived(t *testing.T) {
	const n = 10
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, n)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}
	require.Equal(t, exitOK, runIn(args...).code)
	require.Equal(t, exitOK, runIn("prune", "-journal", journal, "-older", "0s").code)

	out := runIn(append(args, "-pruned", "send")...)

	require.Equal(t, exitOK, out.code, out.stderr)
	assert.Contains(t, out.stderr, "sending 10 operations pruned from the journal again")
	assert.Equal(t, n, countReplayed(results(t, out.stdout)))
	assertOnce(t, srv, n)

	// Back in the journal, they are the journal's again: no refusal.
	again := runIn(args...)
	require.Equal(t, exitOK, again.code, again.stderr)
	assertOnce(t, srv, n)
}

func TestPruneDryRunAndPending(t *testing.T) {
	dir := t.TempDir()
	journal := filepath.Join(dir, "journal")
	writeJournal(t, journal, idemhttp.StateDone, idemhttp.StatePending, idemhttp.StateDone)

	dry := runIn("prune", "-journal", journal, "-older", "0s", "-dry-run", "-json")

	require.Equal(t, exitOK, dry.code, dry.stderr)
	var views []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(dry.stdout), "\n") {
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &v), l)
		views = append(views, v)
	}
	require.Len(t, views, 2, "the done entries")
	for _, v := range views {
		assert.Equal(t, "done", v["state"])
		assert.Contains(t, v, "operation")
		assert.Contains(t, v, "key")
	}
	assert.Contains(t, dry.stderr, "would prune 2 entries")
	assert.Contains(t, dry.stderr, "kept 1 pending")
	assert.Len(t, operations(t, journal), 3, "a dry run deletes nothing")
	assert.NoFileExists(t, journal+prunedSuffix)

	out := runIn("prune", "-journal", journal, "-older", "0s")

	require.Equal(t, exitOK, out.code, out.stderr)
	assert.Len(t, operations(t, journal), 1, "the pending entry is kept")
	recs, err := readPruned(journal+prunedSuffix, nil)
	require.NoError(t, err)
	assert.Len(t, recs, 2)
	fi, err := os.Stat(journal + prunedSuffix)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	all := runIn("prune", "-journal", journal, "-older", "0s", "-include-pending")

	require.Equal(t, exitOK, all.code, all.stderr)
	left := runIn("pending", "-all", "-json", "-journal", journal)
	assert.Empty(t, left.stdout)
	recs, err = readPruned(journal+prunedSuffix, nil)
	require.NoError(t, err)
	assert.Len(t, recs, 3)
}

func TestReadPruned(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "j.pruned")
	good := `{"operation":"a","key":"k1","state":"done","status":200,"updated":"2026-01-01T00:00:00Z","pruned":"2026-01-02T00:00:00Z"}` + "\n"
	tests := []struct {
		name    string
		give    string
		want    []string
		wantErr string
	}{
		{name: "empty", give: "", want: nil},
		{name: "one", give: good, want: []string{"a"}},
		{name: "torn tail ignored", give: good + `{"operation":"b","ke`, want: []string{"a"}},
		{name: "damage in the middle", give: "{oops\n" + good, wantErr: "j.pruned:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, []byte(tt.give), 0o600))
			recs, err := readPruned(path, nil)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			var got []string
			for op := range recs {
				got = append(got, op)
			}
			assert.ElementsMatch(t, tt.want, got)
		})
	}
	recs, err := readPruned(filepath.Join(dir, "missing"), nil)
	assert.NoError(t, err)
	assert.Empty(t, recs)
}

// An entry pruned while pending (-include-pending) is reported failed by
// -pruned skip, never as done: whether it ran is unknown.
func TestPrunedPendingSkippedAsFailed(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, 2)
	journal := filepath.Join(dir, "journal")
	writeJournal(t, journal, idemhttp.StatePending)
	require.Equal(t, exitOK, runIn("prune", "-journal", journal, "-older", "0s", "-include-pending").code)
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}

	refused := runIn(args...)
	assert.Equal(t, exitRefused, refused.code, refused.stderr)
	assert.Contains(t, refused.stderr, `"op-000" (line 1)`)

	out := runIn(append(args, "-pruned", "skip")...)

	assert.Equal(t, exitFailed, out.code, out.stderr)
	res := results(t, out.stdout)
	assert.Equal(t, resultFailed, res[opID(0)].Result)
	assert.Contains(t, res[opID(0)].Error, "whether it ran is unknown")
	assert.Equal(t, resultOK, res[opID(1)].Result)
	assert.Equal(t, map[string]int{opID(1): 1}, srv.Snapshot(), "the pruned operation is not sent")
}

// prune -include-pending removes abandoned entries too: an operator's
// act, through filejournal.Journal.Forget, since Delete (the client's
// withdrawal) refuses an abandoned entry (issue 32's bugFleetExpiredRerun).
// Checked to fail with prune calling Delete again.
func TestPruneIncludePendingRemovesAbandoned(t *testing.T) {
	dir := t.TempDir()
	journal := filepath.Join(dir, "journal")
	writeJournal(t, journal, idemhttp.StateAbandoned, idemhttp.StatePending)

	kept := runIn("prune", "-journal", journal, "-older", "0s")
	require.Equal(t, exitOK, kept.code, kept.stderr)
	assert.Contains(t, kept.stderr, "kept 2 pending or abandoned")
	assert.Len(t, operations(t, journal), 2)

	all := runIn("prune", "-journal", journal, "-older", "0s", "-include-pending")

	require.Equal(t, exitOK, all.code, all.stderr)
	left := runIn("pending", "-all", "-json", "-journal", journal)
	assert.Empty(t, left.stdout)
}
