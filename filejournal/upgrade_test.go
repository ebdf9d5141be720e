package filejournal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
)

// baselineDir holds the journals the previous release wrote (format 4):
// see its README for how they were made.
const baselineDir = "testdata/baseline-2d053bb"

// baselineURL is the URL of the baseline journals' entries.
const baselineURL = "https://api.example.com/v1/charges?currency=eur"

// toServer is a transport that sends every request to srv, whatever its
// URL names.
func toServer(srv *scripted) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		u, err := url.Parse(srv.URL)
		if err != nil {
			return nil, err
		}
		r = r.Clone(r.Context())
		r.URL.Scheme, r.URL.Host, r.Host = u.Scheme, u.Host, u.Host
		return http.DefaultTransport.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// copyBaseline copies the baseline journal name, and its index file if
// it has one, into a new directory, and returns the journal's path there.
func copyBaseline(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	for _, suffix := range []string{"", indexSuffix} {
		b, err := os.ReadFile(filepath.Join(baselineDir, name+suffix))
		if errors.Is(err, os.ErrNotExist) && suffix != "" {
			continue
		}
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+suffix), b, 0o600))
	}
	return filepath.Join(dir, name)
}

// fileVersion is the format version in a journal file's header.
func fileVersion(t *testing.T, path string) uint32 {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(b), wal.FileHeaderLen)
	return binary.LittleEndian.Uint32(b[8:12])
}

// Journals written by the previous release (2d053bb: format 4, close
// markers without a nonce, an index file of version 1) open with this
// build, read-only without a change to the file, and for writing: every
// entry as it was (pending entries with their keys and bodies, done and
// abandoned ones final, deleted and pruned ones gone, no credential), a
// Client resumes the pending ones under their own keys, a rerun of a
// done operation sends nothing, and the file is then in this build's
// format and opens again. Checked to fail with CheckFileHeader accepting
// only wal.Version (ErrVersion on every file), and with replay taking
// version 4's one-byte close marker for a record of the layer above
// (corrupt: unknown record kind).
func TestUpgradeFromBaseline(t *testing.T) {
	tests := []struct {
		name      string
		later     string // the key of the entry begun after the compaction, if any
		clean     bool
		wantIndex bool // an index file of the old version lies beside it
	}{
		{name: "journal-v4", clean: true},
		{name: "journal-v4-compacted", later: "k-after-compaction", clean: true, wantIndex: true},
		{name: "journal-v4-crashed", later: "k-after-crash", wantIndex: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			path := copyBaseline(t, tt.name)
			before, err := os.ReadFile(path)
			require.NoError(t, err)
			require.EqualValues(t, 4, fileVersion(t, path))
			_, err = os.Stat(path + indexSuffix)
			require.Equal(t, tt.wantIndex, err == nil)

			ro, err := Open(path, &Options{ReadOnly: true})
			require.NoError(t, err, "read-only")
			mark := ijHighWater(t, ro)
			require.False(t, mark.IsZero())
			require.NoError(t, ro.Verify(ctx))
			require.NoError(t, ro.Close())
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, before, after, "a read-only open changes nothing")

			// The entries are hours old by the clock of the machine that
			// wrote them: the clock is set a minute past the journal's mark.
			clock := &ijClock{t: mark.Add(time.Minute)}
			j, err := Open(path, &Options{Clock: clock.now, PruneInterval: -1})
			require.NoError(t, err)
			closed := false
			t.Cleanup(func() {
				if !closed {
					assert.NoError(t, j.Close())
				}
			})
			assert.Equal(t, tt.clean, j.Stats().CleanClose)
			assert.False(t, j.Stats().IndexLoaded, "an index file of another version is ignored")
			require.NoError(t, j.Verify(ctx))
			assert.Equal(t, mark, ijHighWater(t, j))

			wantPending := []string{"k-pending", "k-pending-tried", "k-pending-no-op"}
			if tt.later != "" {
				wantPending = append(wantPending, tt.later)
			}
			pending, err := j.Pending(ctx)
			require.NoError(t, err)
			var keys []string
			for _, e := range pending {
				keys = append(keys, e.Key)
				assert.Equal(t, http.MethodPost, e.Method)
				assert.NotEmpty(t, e.Body, e.Key)
				assert.Empty(t, e.Header.Get("Authorization"), e.Key)
			}
			assert.Equal(t, wantPending, keys, "oldest first")
			tried, err := j.Get(ctx, "k-pending-tried")
			require.NoError(t, err)
			assert.Equal(t, 2, tried.Attempts)
			assert.Equal(t, 503, tried.LastStatus)
			assert.Equal(t, "t-k-pending-tried", tried.Header.Get("X-Trace"))
			assert.Equal(t, `{"amount":200}`, string(tried.Body))
			for key, want := range map[string]struct {
				state  idemhttp.State
				status int
			}{
				"k-done":      {idemhttp.StateDone, 201},
				"k-done-422":  {idemhttp.StateDone, 422},
				"k-abandoned": {idemhttp.StateAbandoned, 0},
			} {
				e, err := j.Get(ctx, key)
				require.NoError(t, err, key)
				assert.Equal(t, want.state, e.State, key)
				assert.Equal(t, want.status, e.LastStatus, key)
			}
			for _, key := range []string{"k-deleted", "k-pruned"} {
				_, err := j.Get(ctx, key)
				assert.ErrorIs(t, err, idemhttp.ErrNotFound, key)
			}

			// The entries name the API the old release called: every
			// request goes to the test server instead.
			srv := newScripted(t, reply(200, `{"id":"ch_1"}`))
			c := &idemhttp.Client{Journal: j, Policy: fast(), HTTPClient: &http.Client{Transport: toServer(srv)}}
			results, err := c.Resume(ctx, nil)
			require.NoError(t, err)
			require.Len(t, results, len(wantPending))
			for _, r := range results {
				assert.NoError(t, r.Err, r.Entry.Key)
			}
			var sent []string
			for _, h := range srv.Hits() {
				sent = append(sent, h.Key)
			}
			slices.Sort(sent)
			assert.Equal(t, slices.Sorted(slices.Values(wantPending)), sent, "each pending entry resent under its own key")
			_, err = c.Do(post(t, baselineURL, `{"amount":400}`).WithContext(idemhttp.WithOperation(ctx, "op-done")))
			var done *idemhttp.DoneError
			require.ErrorAs(t, err, &done, "a done operation stays done")
			assert.Equal(t, 201, done.Status)
			_, err = c.Do(post(t, baselineURL, `{"amount":500}`).WithContext(idemhttp.WithOperation(ctx, "op-abandoned")))
			assert.ErrorIs(t, err, idemhttp.ErrKeyExpired)
			assert.Len(t, srv.Hits(), len(wantPending), "nothing else sent")

			require.NoError(t, j.Close())
			closed = true
			assert.EqualValues(t, wal.Version, fileVersion(t, path), "written by this build: in its format")
			j, err = Open(path, &Options{Clock: clock.now, PruneInterval: -1})
			require.NoError(t, err)
			closed = false
			require.NoError(t, j.Verify(ctx))
			pending, err = j.Pending(ctx)
			require.NoError(t, err)
			assert.Empty(t, pending)
			e, err := j.Get(ctx, "k-pending")
			require.NoError(t, err)
			assert.Equal(t, idemhttp.StateDone, e.State)
			assert.True(t, bytes.Equal([]byte(`{"amount":100}`), e.Body))
		})
	}
}
