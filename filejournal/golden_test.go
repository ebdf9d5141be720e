package filejournal

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The journal the previous release (commit 2d053bb) wrote, with the file
// journal still in the root package, keeps working: this build opens it,
// reads every entry as it was written, reruns a done operation without
// sending it, refuses an abandoned one, resumes the pending ones under
// their keys and bodies, appends its own records to the old file, and
// reopens it. testdata/golden-2d053bb/README.md says how the file was
// made (the upgrade of its format is TestUpgradeFromBaseline's). The
// previous release stored no Fingerprint for an entry begun directly (a
// producer's), and a rerun of such an operation was refused as a
// *KeyMismatchError whatever its state: the client computes it from the
// stored request. Checked to fail with that computation removed (the
// abandoned operation's rerun was a mismatch).
func TestJournalOfThePreviousRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	b, err := os.ReadFile(filepath.Join("testdata", "golden-2d053bb", "journal-2d053bb"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	ctx := context.Background()

	j, err := Open(path, nil)
	require.NoError(t, err)
	defer func() { _ = j.Close() }()
	require.NoError(t, j.Verify(ctx))

	done, err := j.Lookup(ctx, "op-done")
	require.NoError(t, err)
	done, err = j.Get(ctx, done.Key)
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, done.State)
	assert.Equal(t, http.StatusCreated, done.LastStatus)
	pending, err := j.Lookup(ctx, "op-pending")
	require.NoError(t, err)
	pending, err = j.Get(ctx, pending.Key)
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StatePending, pending.State)
	assert.Equal(t, `{"amount":2000}`, string(pending.Body))
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "X-Trace": {"golden"}}, pending.Header)
	assert.True(t, pending.NotBefore.IsZero(), "the previous release parked nothing")
	noOp, err := j.Get(ctx, "key-no-op")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StatePending, noOp.State)
	abandoned, err := j.Lookup(ctx, "op-abandoned")
	require.NoError(t, err)
	abandoned, err = j.Get(ctx, abandoned.Key)
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateAbandoned, abandoned.State)
	_, err = j.Lookup(ctx, "op-withdrawn")
	assert.ErrorIs(t, err, idemhttp.ErrNotFound)

	// The entries name the port of a server long gone: every connection
	// goes to this test's server instead.
	srv := newScripted(t, reply(http.StatusCreated, `{"id":"ch_resumed"}`))
	addr := srv.Listener.Addr().String()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	// The entries are as old as the file: a retention of a century keeps
	// them resendable.
	c := &idemhttp.Client{Journal: j, Policy: &idemhttp.Policy{Retention: 100 * 365 * 24 * time.Hour}, HTTPClient: &http.Client{Transport: tr}}

	_, err = c.Do(post(t, done.URL, `{"amount":1000}`).WithContext(idemhttp.WithOperation(ctx, "op-done")))
	var de *idemhttp.DoneError
	require.ErrorAs(t, err, &de, "done is done")
	assert.Equal(t, done.Key, de.Key)
	_, err = c.Do(post(t, abandoned.URL, `{"amount":4}`).WithContext(idemhttp.WithOperation(ctx, "op-abandoned")))
	assert.ErrorIs(t, err, idemhttp.ErrKeyExpired)
	assert.Empty(t, srv.Hits(), "nothing sent for a done or an abandoned operation")

	results, err := c.Resume(ctx, &idemhttp.ResumeOptions{Concurrency: 1})
	require.NoError(t, err)
	require.Len(t, results, 2)
	for _, r := range results {
		require.NoError(t, r.Err, r.Entry.Key)
		assert.Equal(t, http.StatusCreated, r.StatusCode)
	}
	sent := map[string]string{}
	for _, h := range srv.Hits() {
		sent[h.Key] = h.Path + " " + h.Body
	}
	assert.Equal(t, map[string]string{
		pending.Key: `/v1/slow {"amount":2000}`,
		noOp.Key:    `/v1/refunds {"amount":3}`,
	}, sent, "each resent once, under its key, with its body")

	require.NoError(t, j.Close())
	j, err = Open(path, nil)
	require.NoError(t, err)
	require.NoError(t, j.Verify(ctx))
	for _, key := range []string{pending.Key, noOp.Key, done.Key} {
		e, err := j.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idemhttp.StateDone, e.State, key)
	}
	p, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Empty(t, p)
	if err := j.Close(); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}
