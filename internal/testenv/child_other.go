//go:build !unix

package testenv

import (
	"os"
	"testing"
)

// RunChild skips the test: crash tests kill their children with SIGKILL
// and read how they died, which needs Unix. It is here so that the tests
// of every module build (and are vetted) for Windows too.
func RunChild(t testing.TB, env []string, stop func() bool) (killed bool) {
	t.Helper()
	t.Skip("crash tests need Unix signals")
	return false
}

// Die kills the calling process (os.Process.Kill, TerminateProcess on
// Windows): no deferred function runs. It does not return.
func Die() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {} // the kill is on its way
}
