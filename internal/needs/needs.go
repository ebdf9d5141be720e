// Package needs is how idemhttp's tests skip for want of something the
// machine lacks and CI provides: a server (PostgreSQL, Redis, RabbitMQ,
// NATS), a program (redis-server, bash), a privilege (root, for the
// power-cut test). One way to skip, so that a skip can never pass for a
// test that ran:
//
//   - On CI (CI=true) [Missing] fails the test instead: CI provides all of
//     them, and a suite that skips there is a broken setup.
//   - Elsewhere it skips, and when the variable [ReportEnv] names a file,
//     appends a line to it, which the test command (`bash .ci/test`, the
//     README's) turns into one line per skipped suite at the end of its
//     output: what was not tested, and the command that tests it. go
//     test shows a passing package's skips only with -v; without the
//     report, a run without the servers printed "ok" for packages whose
//     every database test had skipped.
//
// It is for tests only: no non-test file imports it.
package needs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ReportEnv names the variable that holds the path of the skip report:
// one line per skipped test, tab-separated: the package's directory
// (relative to the workspace), what it lacked, the command that runs it,
// and the test's name. The test command sets it.
const ReportEnv = "IDEMHTTP_SKIP_REPORT"

// PkgPlaceholder, in Missing's run, stands for the test's package
// directory relative to the workspace root, as a go package pattern
// ("./contrib/postgres").
const PkgPlaceholder = "{pkg}"

// Missing ends t because the machine lacks what (for example
// "PostgreSQL: IDEMHTTP_POSTGRES_URL is not set"): on CI (CI=true) it
// fails t, elsewhere it skips t and records the skip in the report
// ([ReportEnv]). run is the command that runs the test with what
// provided, in which [PkgPlaceholder] stands for the package (for
// example `eval "$(bash .ci/services.sh)" && go test -race -count=1
// {pkg}/...`). A report that cannot be written fails t: a skip that
// would go unreported is what this package exists to prevent.
func Missing(t testing.TB, what, run string) {
	t.Helper()
	pkg := packageDir()
	pattern := "./" + pkg
	if pkg == "." {
		pattern = "."
	}
	run = strings.ReplaceAll(run, PkgPlaceholder, pattern)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s; on CI every suite must run: provide it before the tests (%s)", what, run)
	}
	if path := os.Getenv(ReportEnv); path != "" {
		if err := appendLine(path, pkg, what, run, t.Name()); err != nil {
			t.Fatalf("%s, and the skip report cannot be written: %v", what, err)
		}
	}
	t.Skipf("%s; to run this test: %s", what, run)
}

// appendLine appends one report line to path. Each line is written with
// one write on a file opened O_APPEND, so that the test binaries of
// several packages, running at once, never interleave within a line.
func appendLine(path string, fields ...string) error {
	for i, f := range fields {
		fields[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(f)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(fields, "\t") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// packageDir returns the directory of the running test's package (the
// test binary runs in it) relative to the nearest directory above with a
// go.work file, with slashes; "." when there is none, or it is that
// directory.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			rel, err := filepath.Rel(dir, wd)
			if err != nil {
				return "."
			}
			return filepath.ToSlash(rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "."
		}
		dir = parent
	}
}

// Services is the run of a test that needs the servers .ci/services.sh
// starts (on loopback, as root on Debian; it prints the variables that
// name them), from the repository's root.
const Services = `eval "$(bash .ci/services.sh)" && go test -race -count=1 ` + PkgPlaceholder
