package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Keys are derived by default, from a key file created beside the journal
// on the first run, so a lost journal does not mean duplicates: the rerun
// sends the same keys and the server replays. The same scenario with
// -random-keys duplicates every charge, which shows the test can fail.
func TestBatchDerivedKeysByDefault(t *testing.T) {
	const n = 5
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, n)
	journal := filepath.Join(dir, "journal")
	args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}

	first := runIn(args...)

	require.Equal(t, exitOK, first.code, first.stderr)
	keyFile := journal + ".key"
	fi, err := os.Stat(keyFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	secret, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	secret = bytes.TrimSpace(secret)
	assert.Contains(t, first.stderr, "created key file "+keyFile)
	assert.NotContains(t, first.stderr, string(secret), "the secret is never printed")
	assert.NotContains(t, first.stdout, string(secret))
	res := results(t, first.stdout)
	for i := range n {
		want, err := idemhttp.DeriveKey(secret, opID(i))
		require.NoError(t, err)
		assert.Equal(t, want, res[opID(i)].Key)
	}

	// The journal is lost; the key file is not.
	require.NoError(t, os.Remove(journal))
	second := runIn(args...)

	require.Equal(t, exitOK, second.code, second.stderr)
	assertOnce(t, srv, n)
	assert.Equal(t, n, countReplayed(results(t, second.stdout)), "the server replays every charge")
	assert.NotContains(t, second.stderr, "created key file", "the key file is reused")

	// A journal without its key file (an older idemctl's, or the file
	// lost): a new one is made, with a note.
	require.NoError(t, os.Remove(keyFile))
	third := runIn(args...)
	require.Equal(t, exitOK, third.code, third.stderr)
	assert.Contains(t, third.stderr, "already existed without this key file")
	assertOnce(t, srv, n)

	t.Run("random keys duplicate", func(t *testing.T) {
		srv := newServer(t, idemtest.Faults{})
		journal := filepath.Join(t.TempDir(), "journal")
		args := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none", "-random-keys"}
		require.Equal(t, exitOK, runIn(args...).code)
		require.NoError(t, os.Remove(journal))
		require.Equal(t, exitOK, runIn(args...).code)
		assert.Equal(t, n, srv.Stats().Duplicates, "with random keys a lost journal runs everything again")
		assert.NoFileExists(t, journal+".key")
	})
}

func countReplayed(res map[string]result) int {
	n := 0
	for _, r := range res {
		if r.Replayed {
			n++
		}
	}
	return n
}

// The environment variable wins over the key file and creates none.
func TestBatchKeySecretFromEnv(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, 2)
	journal := filepath.Join(dir, "journal")
	secret := "0123456789abcdef-from-the-env"

	out := runInProcess(context.Background(), map[string]string{defaultSecretEnv: secret},
		"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none")

	require.Equal(t, exitOK, out.code, out.stderr)
	want, err := idemhttp.DeriveKey([]byte(secret), opID(1))
	require.NoError(t, err)
	assert.Equal(t, want, results(t, out.stdout)[opID(1)].Key)
	assert.NoFileExists(t, journal+".key")
	assert.NotContains(t, out.stderr, secret)
}

func TestBatchKeyErrors(t *testing.T) {
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	in := writeInput(t, dir, 1)
	journal := filepath.Join(dir, "journal")
	open := filepath.Join(dir, "open.key")
	require.NoError(t, os.WriteFile(open, []byte("0123456789abcdef0123456789abcdef\n"), 0o600))
	require.NoError(t, os.Chmod(open, 0o644))
	short := filepath.Join(dir, "short.key")
	require.NoError(t, os.WriteFile(short, []byte("tooshort\n"), 0o600))
	base := []string{"batch", "-url", srv.URL, "-in", in, "-journal", journal, "-progress", "none"}
	tests := []struct {
		name     string
		give     []string
		environ  map[string]string
		wantCode int
		wantErr  string
	}{
		{"key file readable by others", []string{"-key-file", open}, nil, exitJournal, "readable or writable by others"},
		{"key file too short", []string{"-key-file", short}, nil, exitJournal, "at least 16 are needed"},
		{"env secret too short", nil, map[string]string{defaultSecretEnv: "short"}, exitUsage, "too short"},
		{"named env unset", []string{"-key-secret-env", "NOPE"}, nil, exitUsage, "NOPE is empty or unset"},
		{"random with key file", []string{"-random-keys", "-key-file", short}, nil, exitUsage, "cannot be combined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := runInProcess(context.Background(), tt.environ, append(base, tt.give...)...)
			assert.Equal(t, tt.wantCode, out.code, out.stderr)
			assert.Contains(t, out.stderr, tt.wantErr)
			assert.NotContains(t, out.stderr, "tooshort", "the secret is never printed")
		})
	}
	assert.Empty(t, srv.Snapshot(), "nothing was sent")
}
