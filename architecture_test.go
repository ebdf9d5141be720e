package idemhttp

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The layering docs/architecture.md writes down, checked from the
// packages' own imports (their non-test files): the log knows nothing of
// the client, the root no storage engine, and the shared rules nothing of
// anyone. Checked to fail with the root importing internal/wal, and with
// internal/wal importing net/http.
func TestArchitecture(t *testing.T) {
	const mod = "github.com/idemkit/idemhttp"
	rules := []struct {
		pkg      string   // directory, from the module's root
		mayOnly  []string // the repository's packages it may import; nil: none
		mustNots []string // prefixes it must not import
	}{
		{pkg: ".", mayOnly: []string{"idemtrace", "internal/contract", "internal/plant", "internal/simkey"}},
		{pkg: "internal/simkey", mustNots: []string{"net/http", "net/url"}},
		{pkg: "idemtrace"},
		{pkg: "internal/contract"},
		{pkg: "internal/plant", mustNots: []string{"net/http", "net/url"}},
		{pkg: "internal/needs"},
		{pkg: "internal/wal", mustNots: []string{"net/http", "net/url"}},
		{pkg: "internal/wal/simdisk", mayOnly: []string{"internal/wal"}, mustNots: []string{"net/http", "net/url"}},
		{pkg: "filejournal", mayOnly: []string{".", "internal/contract", "internal/wal"}},
		{pkg: "journaltest", mayOnly: []string{".", "internal/contract", "internal/plant"}},
		{pkg: "internal/fingerprint"},
		{pkg: "internal/servercore", mayOnly: []string{"internal/fingerprint", "internal/plant"}, mustNots: []string{"github.com/jackc", "github.com/redis", "database/sql"}},
		{pkg: "internal/servermodel", mayOnly: []string{"idemserver", "internal/servercore", "internal/plant"}},
		{pkg: "internal/servertest", mayOnly: []string{"idemserver", "internal/servercore"}},
		{pkg: "idemserver", mayOnly: []string{".", "internal/contract", "internal/fingerprint", "internal/plant", "internal/serverclock", "internal/servercore"}},
		{pkg: "internal/serverclock"},
		{pkg: "idemtest", mayOnly: []string{".", "idemserver", "internal/contract"}},
		{pkg: "inbox", mayOnly: []string{".", "internal/plant"}},
		{pkg: "internal/msgsim", mayOnly: []string{"inbox", "internal/plant", "internal/shrink"}},
		{pkg: "internal/shrink"},
	}
	for _, r := range rules {
		t.Run(r.pkg, func(t *testing.T) {
			imports := packageImports(t, r.pkg)
			allowed := map[string]bool{}
			for _, p := range r.mayOnly {
				allowed[filepath.ToSlash(filepath.Join(mod, p))] = true
			}
			for imp := range imports {
				for _, no := range r.mustNots {
					assert.False(t, imp == no || strings.HasPrefix(imp, no+"/"), "%s imports %s", r.pkg, imp)
				}
				if imp != mod && !strings.HasPrefix(imp, mod+"/") {
					continue // the standard library and dependencies
				}
				assert.True(t, allowed[imp], "%s imports %s", r.pkg, imp)
			}
		})
	}

	// The root module requires none of the nested modules.
	gomod, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	assert.NotContains(t, string(gomod), mod+"/", "the root module requires a nested one")
}

// packageImports returns the imports of the non-test Go files in dir.
func packageImports(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	require.NotEmpty(t, files, dir)
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		require.NoError(t, err, f)
		for _, imp := range af.Imports {
			out[strings.Trim(imp.Path.Value, `"`)] = true
		}
	}
	return out
}
