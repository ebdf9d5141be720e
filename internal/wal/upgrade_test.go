package wal

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A file of format 4 (the previous release's: a close marker is a lone
// zero byte) opens: read-only as it is, its marker taken for one (the
// file is clean); for writing, its header moved to this version in place
// (the same salt: every batch stays valid) before anything is appended,
// and the records it held, and those appended after, read back. Checked
// to fail with the header left as it was (the version stays 4), and
// with format 4's marker taken for a record.
func TestOpenUpgradesAnOlderFormat(t *testing.T) {
	old4 := file(batch(1, rec("Bone"), rec("Btwo")), batch(2, AppendRecord(nil, []byte{0})))
	binary.LittleEndian.PutUint32(old4[8:], 4)
	binary.LittleEndian.PutUint32(old4[20:], Checksum(old4[:20]))
	path := logPath(t)
	writeFile(t, path, old4, 0o600)

	var c collect
	ro, err := Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	assert.True(t, ro.Stats().Clean, "format 4's marker ends the file")
	assert.Equal(t, []string{"Bone", "Btwo"}, c.payloads)
	require.NoError(t, ro.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, old4, raw, "a read-only open changes nothing")

	c = collect{}
	l, err := Open(path, nil, c.apply)
	require.NoError(t, err)
	assert.True(t, l.Stats().Clean)
	raw, err = os.ReadFile(path)
	require.NoError(t, err)
	salt, version, err := ReadFileHeader(raw)
	require.NoError(t, err)
	assert.EqualValues(t, Version, version, "upgraded before anything is appended")
	assert.EqualValues(t, testSalt, salt)
	assert.Equal(t, old4[FileHeaderLen:], raw[FileHeaderLen:], "the batches as they were")
	appendRecord(t, l, "Bthree")
	require.NoError(t, l.Close())

	c = collect{}
	l, err = Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	assert.Equal(t, []string{"Bone", "Btwo", "Bthree"}, c.payloads)
	require.NoError(t, l.Close())
}
