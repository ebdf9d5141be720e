package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/needs"
)

// readmeSection returns the text of README.md between the marker that
// starts with "<!-- "+name+":" and "<!-- end "+name+" -->".
func readmeSection(t *testing.T, name string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	s := string(readme)
	start := strings.Index(s, "<!-- "+name+":")
	end := strings.Index(s, "<!-- end "+name+" -->")
	require.True(t, start >= 0 && end > start, "README.md has no %s markers", name)
	return s[start:end]
}

// shBlocks returns the sh code blocks of text, as one script.
func shBlocks(t *testing.T, text string) string {
	t.Helper()
	var script strings.Builder
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text, -1) {
		script.WriteString(m[1])
	}
	require.NotEmpty(t, script.String())
	return script.String()
}

// userBuildTable returns the modules and versions README.md's "What a
// user's build pulls in" names, and the packages its program imports
// (the RELEASE_CHECK_IMPORTS it gives).
func userBuildTable(t *testing.T) (versions map[string]string, imports []string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	s := string(readme)
	start := strings.Index(s, "## What a user's build pulls in")
	require.Positive(t, start)
	s = s[start:]
	s = s[:strings.Index(s[3:], "\n## ")+3]
	m := regexp.MustCompile(`RELEASE_CHECK_IMPORTS="([^"]+)"`).FindStringSubmatch(s)
	require.NotNil(t, m, "the packages of the user's program")
	imports = strings.Fields(m[1])
	versions = map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		for _, mv := range regexp.MustCompile("`([^`]+)`(?: (v[0-9][^,| ]*))?").FindAllStringSubmatch(line, -1) {
			if strings.Contains(mv[1], ".") && strings.Contains(mv[1], "/") && !strings.HasPrefix(mv[1], "github.com/idemkit/") {
				versions[mv[1]] = mv[2] // "" when the README names none
			}
		}
	}
	require.NotEmpty(t, versions)
	return versions, imports
}

// upstreamProxy returns the configured GOPROXY without "direct" and
// "off", as .ci/release-check uses it behind its local proxies.
func upstreamProxy(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOPROXY").Output()
	require.NoError(t, err)
	var keep []string
	for _, p := range strings.FieldsFunc(strings.TrimSpace(string(out)), func(r rune) bool { return r == ',' || r == '|' }) {
		if p != "direct" && p != "off" {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, ",")
}

// TestInstall (issue 34 §1) does what README.md's Install section tells
// a user to do before the first release, in a fresh module outside the
// repository: its commands, copied from the README and run by bash, with
// the clone replaced by a link to this checkout (offline, and the tree
// under test rather than its last commit); the module imports the
// packages of "What a user's build pulls in". Then the program builds
// and runs, idemctl runs, and the user's module graph holds what the
// README says, at the versions it names: every module of the table and
// no other requirement. Third-party modules come from the local module
// cache, or the configured proxy when missing there. Checked to fail
// with the README's replace of contrib/redis removed (tidy asks the
// proxy for the unpublished module), and with the table naming pgx
// v5.12.0, as it did.
func TestInstall(t *testing.T) {
	if runtime.GOOS == "windows" {
		needs.Missing(t, "a POSIX shell: the README's install commands are a shell script", "go test -race -count=1 -run 'TestInstall$' {pkg} on Linux or macOS")
	}
	for _, prog := range []string{"bash", "go"} {
		if _, err := exec.LookPath(prog); err != nil {
			needs.Missing(t, prog+": not found", "go test -race -count=1 -run 'TestInstall$' {pkg} with "+prog+" installed")
		}
	}
	if testing.Short() {
		t.Skip("builds a module of its own with pgx and go-redis")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	const clone = "git clone https://github.com/idemkit/idemhttp ../idemhttp\n"
	script := shBlocks(t, readmeSection(t, "install"))
	require.Contains(t, script, clone)
	script = strings.Replace(script, clone, fmt.Sprintf("ln -s %q ../idemhttp\n", root), 1)
	versions, imports := userBuildTable(t)

	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.Mkdir(app, 0o755))
	modcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
	require.NoError(t, err)
	proxy := "file://" + filepath.Join(strings.TrimSpace(string(modcache)), "cache", "download")
	if up := upstreamProxy(t); up != "" {
		proxy += "," + up
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOWORK=") && !strings.HasPrefix(kv, "GOPROXY=") && !strings.HasPrefix(kv, "GOBIN=") {
			env = append(env, kv)
		}
	}
	env = append(env, "GOPROXY="+proxy, "GOBIN="+bin)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = app, env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "%s %s\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), stdout.String(), stderr.String())
		return stdout.String()
	}

	// A user's module, whose code imports the packages.
	run("go", "mod", "init", "example.com/app")
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n\t\"fmt\"\n\n")
	for _, p := range imports {
		if p == "github.com/idemkit/idemhttp" {
			fmt.Fprintf(&src, "\t%q\n", p)
		} else {
			fmt.Fprintf(&src, "\t_ %q\n", p)
		}
	}
	src.WriteString(")\n\nfunc main() { fmt.Println(idemhttp.NewKey() != \"\") }\n")
	require.NoError(t, os.WriteFile(filepath.Join(app, "main.go"), []byte(src.String()), 0o644))

	run("bash", "-e", "-c", script)

	assert.Equal(t, "true\n", run("go", "run", "."), "the program builds and runs")
	help := run(filepath.Join(bin, "idemctl"), "demo", "-h")
	assert.Contains(t, help, "Usage: idemctl demo", "idemctl installed")

	for mod, want := range versions {
		got := strings.TrimSpace(run("go", "list", "-m", "-f", "{{.Version}}", mod))
		if want != "" {
			assert.Equal(t, want, got, "README.md names %s at %s; the user's build gets %s", mod, want, got)
		}
	}
	var gomod struct{ Require []struct{ Path string } }
	require.NoError(t, json.Unmarshal([]byte(run("go", "mod", "edit", "-json")), &gomod))
	for _, r := range gomod.Require {
		if !strings.HasPrefix(r.Path, "github.com/idemkit/idemhttp") {
			_, listed := versions[r.Path]
			assert.True(t, listed, "the user's go.mod requires %s, which README.md does not list", r.Path)
		}
	}
	var required []string
	for _, r := range gomod.Require {
		required = append(required, r.Path)
	}
	for mod := range versions {
		assert.True(t, slices.Contains(required, mod), "README.md lists %s, which the user's go.mod does not require", mod)
	}
}
