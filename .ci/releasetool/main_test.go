package main

import (
	"archive/zip"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newRepo writes a workspace of a root module and a nested one in the form
// a new module arrives in: a requirement on v0.0.0 and a replace.
func newRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"go.work":        "go 1.25.0\n\nuse (\n\t.\n\t./contrib/x\n)\n\nreplace example.com/r v0.1.0 => ./\n",
		"go.mod":         "module example.com/r\n\ngo 1.25.0\n",
		"r.go":           "package r\n",
		"LICENSE":        "the licence\n",
		"contrib/x/x.go": "package x\n\nimport _ \"example.com/r\"\n",
		"contrib/x/go.mod": "module example.com/r/contrib/x\n\ngo 1.25.0\n\n" +
			"require example.com/r v0.0.0\n\nreplace example.com/r => ../../\n",
		"contrib/x/go.sum": "example.com/r v0.0.0 h1:abc=\nexample.com/other v1.0.0 h1:def=\n",
	}
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(data), 0o644))
	}
	return dir
}

func tool(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(append([]string{"-work", filepath.Join(dir, "go.work")}, args...), &out)
	return out.String(), err
}

func read(t *testing.T, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
	require.NoError(t, err)
	return string(data)
}

func TestCheckRefusesTheOldForm(t *testing.T) {
	dir := newRepo(t)
	_, err := tool(t, dir, "check")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "contrib/x/go.mod: replace example.com/r => ../../")
	assert.Contains(t, err.Error(), "cp LICENSE contrib/x/")
	assert.Contains(t, err.Error(), "go.work lacks `replace example.com/r v0.0.0 => ./`")

	_, err = tool(t, dir, "bump", "v0.2.0")
	assert.ErrorContains(t, err, "must not replace project modules", "bump must refuse, not drop, a replace")
}

func TestAdoptThenBump(t *testing.T) {
	dir := newRepo(t)
	_, err := tool(t, dir, "adopt")
	require.NoError(t, err)
	gomod := read(t, dir, "contrib/x/go.mod")
	assert.Contains(t, gomod, "require example.com/r v0.1.0")
	assert.NotContains(t, gomod, "replace")
	assert.Equal(t, "the licence\n", read(t, dir, "contrib/x/LICENSE"))
	_, err = tool(t, dir, "check")
	require.NoError(t, err)

	_, err = tool(t, dir, "bump", "v0.2.0")
	require.NoError(t, err)
	assert.Contains(t, read(t, dir, "contrib/x/go.mod"), "require example.com/r v0.2.0")
	work := read(t, dir, "go.work")
	assert.Contains(t, work, "replace example.com/r v0.2.0 => ./")
	assert.NotContains(t, work, "v0.1.0")
	v, err := tool(t, dir, "version")
	require.NoError(t, err)
	assert.Equal(t, "v0.2.0\n", v)
	tags, err := tool(t, dir, "tags", "v0.2.0")
	require.NoError(t, err)
	assert.Equal(t, "v0.2.0\ncontrib/x/v0.2.0\n", tags)

	_, err = tool(t, dir, "stripsums")
	require.NoError(t, err)
	assert.Equal(t, "example.com/other v1.0.0 h1:def=\n", read(t, dir, "contrib/x/go.sum"))
}

func TestBumpRejectsBadVersions(t *testing.T) {
	dir := newRepo(t)
	for _, v := range []string{"0.2.0", "v0.2", "v2.0.0", "v0.2.0+meta"} {
		_, err := tool(t, dir, "bump", v)
		assert.Error(t, err, v)
	}
}

func TestProxyLayout(t *testing.T) {
	dir := newRepo(t)
	_, err := tool(t, dir, "adopt")
	require.NoError(t, err)
	out := t.TempDir()
	_, err = tool(t, dir, "proxy", "-version", "v0.1.0", "-out", out)
	require.NoError(t, err)
	_, err = tool(t, dir, "proxy", "-version", "v0.1.1", "-out", out)
	require.NoError(t, err)

	vdir := filepath.Join(out, "example.com", "r", "@v")
	assert.Equal(t, "v0.1.0\nv0.1.1\n", read(t, vdir, "list"))
	assert.Contains(t, read(t, vdir, "v0.1.0.info"), `"Version":"v0.1.0"`)
	assert.Equal(t, read(t, dir, "go.mod"), read(t, vdir, "v0.1.0.mod"))

	// The root's zip passes the go command's checks and leaves the nested
	// module out. go.work is in it, as in the zip a tag publishes (the go
	// command ignores a go.work in the module cache).
	zipName := filepath.Join(vdir, "v0.1.0.zip")
	checked, err := modzip.CheckZip(module.Version{Path: "example.com/r", Version: "v0.1.0"}, zipName)
	require.NoError(t, err)
	require.NoError(t, checked.Err())
	zr, err := zip.OpenReader(zipName)
	require.NoError(t, err)
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	assert.Equal(t, []string{"example.com/r@v0.1.0/LICENSE", "example.com/r@v0.1.0/go.mod", "example.com/r@v0.1.0/go.work", "example.com/r@v0.1.0/r.go"}, names)

	nested := filepath.Join(out, "example.com", "r", "contrib", "x", "@v", "v0.1.0.mod")
	assert.True(t, strings.HasPrefix(read(t, filepath.Dir(nested), "v0.1.0.mod"), "module example.com/r/contrib/x"))
}
