package needs

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// childEnv makes TestMissingChild call Missing; otherwise it skips.
const childEnv = "IDEMHTTP_NEEDS_CHILD"

const (
	childWhat = "the thing: IDEMHTTP_THING is not set"
	childRun  = "start-thing && go test " + PkgPlaceholder
)

// TestMissingChild is the test the others run in a child process.
func TestMissingChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestMissing and TestTestCommandReportsSkips")
	}
	Missing(t, childWhat, childRun)
	t.Error("Missing returned")
}

// env is the test's environment with CI and the report variable as
// given ("" unsets), and the child's switch on.
func env(ci, report string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CI=") && !strings.HasPrefix(kv, ReportEnv+"=") {
			out = append(out, kv)
		}
	}
	out = append(out, childEnv+"=1")
	if ci != "" {
		out = append(out, "CI="+ci)
	}
	if report != "" {
		out = append(out, ReportEnv+"="+report)
	}
	return out
}

// TestMissing: off CI a test that lacks something skips and reports the
// skip (package, what, the command with the package filled in, the
// test); on CI it fails. Checked to fail with the CI check removed, and
// with appendLine not called.
func TestMissing(t *testing.T) {
	report := filepath.Join(t.TempDir(), "report")
	cmd := exec.Command(os.Args[0], "-test.run=^TestMissingChild$", "-test.v")
	cmd.Env = env("", report)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "--- SKIP: TestMissingChild")
	assert.Contains(t, string(out), childWhat+"; to run this test: start-thing && go test ./internal/needs")
	got, err := os.ReadFile(report)
	require.NoError(t, err)
	assert.Equal(t, "internal/needs\t"+childWhat+"\tstart-thing && go test ./internal/needs\tTestMissingChild\n", string(got))

	cmd = exec.Command(os.Args[0], "-test.run=^TestMissingChild$", "-test.v")
	cmd.Env = env("true", report)
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "on CI it fails: %s", out)
	assert.Contains(t, string(out), "--- FAIL: TestMissingChild")
	assert.Contains(t, string(out), "on CI every suite must run")
}

// TestTestCommandReportsSkips (issue 34 §2): the README's test command
// (.ci/test) ends with one line per skipped suite, saying what was not
// tested and the command that tests it, and fails on CI if anything
// skipped. Checked to fail with the script's report left out, and with
// its CI check removed (and Missing's, so that the skip reached it).
func TestTestCommandReportsSkips(t *testing.T) {
	if runtime.GOOS == "windows" {
		Missing(t, "a POSIX shell (the test command is a bash script)", "bash .ci/test on Linux or macOS")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		Missing(t, "bash: not found", "bash .ci/test")
	}
	if testing.Short() {
		t.Skip("runs go test in a child")
	}
	script := filepath.Join("..", "..", ".ci", "test")
	run := func(ci string) (string, error) {
		cmd := exec.Command("bash", script, "-run", "^TestMissingChild$", "./internal/needs")
		cmd.Env = env(ci, "")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := run("")
	require.NoError(t, err, out)
	assert.Contains(t, out, "ok  \tgithub.com/idemkit/idemhttp/internal/needs")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	assert.Equal(t, "  internal/needs: 1 test skipped: "+childWhat+"; run: start-thing && go test ./internal/needs", lines[len(lines)-1])

	out, err = run("true")
	assert.Error(t, err, "on CI, a skip fails the command: %s", out)
}
