package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// oldEntries writes a journal holding a pending entry for the first of
// ops and a done one for the second, both created and last updated age
// ago, as an earlier run would have left them.
func oldEntries(t *testing.T, journal string, ops []operation, age time.Duration) {
	t.Helper()
	fj, err := filejournal.Open(journal, nil)
	require.NoError(t, err)
	old := time.Now().Add(-age)
	ctx := context.Background()
	for i, op := range ops[:2] {
		key := idemhttp.NewKey()
		_, err = fj.Begin(ctx, &idemhttp.Entry{
			Operation: op.ID, Key: key, Method: op.Method, URL: op.URL, Body: op.Body,
			Fingerprint: fingerprint(op), Created: old, Updated: old, State: idemhttp.StatePending,
		})
		require.NoError(t, err)
		if i == 1 {
			require.NoError(t, fj.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: old}))
		}
	}
	require.NoError(t, fj.Close())
}

// TestRetentionOneSetting (issue 23): batch, resume and prune read one
// -retention, which is the client's Policy.Retention (a pending entry
// older is abandoned, not resent) and prune's default cutoff. A done
// entry older than the retention stays done: a batch rerun sends nothing
// for it (only prune deletes entries, recording them). Checked: with
// batch's Policy.Retention left at its default, the 2h-old pending entry
// is resent under -retention 1h; with runner.resume letting Resume read
// (and so first prune) the pending entries, the 2h-old done one is sent
// again; with prune's -older default back at 24h, the prune subtest
// fails.
func TestRetentionOneSetting(t *testing.T) {
	setup := func(t *testing.T, srv *idemtest.Server) (in, journal string) {
		dir := t.TempDir()
		in = writeInput(t, dir, 3)
		journal = filepath.Join(dir, "journal")
		ops, bad, err := loadInput(in, mustURL(t, srv.URL), nil, "auto", bodyJSON)
		require.NoError(t, err)
		require.Empty(t, bad)
		oldEntries(t, journal, ops, 2*time.Hour)
		return in, journal
	}

	t.Run("batch", func(t *testing.T) {
		tests := []struct {
			give      []string
			wantState idemhttp.State
			wantSent  map[string]int
		}{
			{nil, idemhttp.StateDone, map[string]int{opID(0): 1, opID(2): 1}},
			{[]string{"-retention", "1h"}, idemhttp.StateAbandoned, map[string]int{opID(2): 1}},
		}
		for _, tt := range tests {
			t.Run(strings.Join(tt.give, " "), func(t *testing.T) {
				srv := newServer(t, idemtest.Faults{})
				in, journal := setup(t, srv)

				out := runIn(append([]string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}, tt.give...)...)

				res := results(t, out.stdout)
				assert.Equal(t, tt.wantState, res[opID(0)].State, out.stderr)
				assert.Equal(t, tt.wantSent, srv.Snapshot())
			})
		}
	})

	t.Run("resume", func(t *testing.T) {
		srv := newServer(t, idemtest.Faults{})
		_, journal := setup(t, srv)

		out := runIn("resume", "-journal", journal, "-retention", "1h", "-progress", "none")

		res := results(t, out.stdout)
		assert.Equal(t, idemhttp.StateAbandoned, res[opID(0)].State, out.stderr)
		assert.Empty(t, srv.Snapshot(), "nothing resent past the retention")
	})

	t.Run("prune", func(t *testing.T) {
		tests := []struct {
			give []string
			want string
		}{
			{nil, "would prune 0 entries"},
			{[]string{"-retention", "1h"}, "would prune 1 entries"},
			{[]string{"-retention", "1h", "-older", "3h"}, "would prune 0 entries"},
		}
		for _, tt := range tests {
			t.Run(strings.Join(tt.give, " "), func(t *testing.T) {
				srv := newServer(t, idemtest.Faults{})
				_, journal := setup(t, srv)

				out := runIn(append([]string{"prune", "-journal", journal, "-dry-run"}, tt.give...)...)

				assert.Equal(t, exitOK, out.code, out.stderr)
				assert.Contains(t, out.stderr, tt.want)
			})
		}
	})

	t.Run("usage", func(t *testing.T) {
		for _, args := range [][]string{
			{"batch", "-url", "http://127.0.0.1:1", "-in", "x"},
			{"resume"},
			{"prune"},
		} {
			out := runIn(append(args, "-journal", "j", "-retention", "0s")...)
			assert.Equal(t, exitUsage, out.code, args[0])
			assert.Contains(t, out.stderr, "-retention must be positive", args[0])
		}
	})
}
