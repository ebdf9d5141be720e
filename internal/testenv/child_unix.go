//go:build unix

package testenv

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// RunChild runs the test binary again as a child process that runs no
// test (-test.run=^$; its TestMain, see [Main], runs the child's code),
// with the variables env ("NAME=value") added to this process's
// environment and its output sent to this process's stderr, and waits for
// it to end. While it runs, RunChild calls stop every 20 ms, and SIGKILLs
// the child once stop returns true; a nil stop never does.
//
// RunChild reports whether the child died by SIGKILL (its own, or
// RunChild's). A child that exits with a status other than 0, dies by
// another signal, or runs for more than 60 s fails the test.
func RunChild(t testing.TB, env []string, stop func() bool) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case err := <-exited:
			if err == nil {
				return false
			}
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "the child")
			ws, ok := ee.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child ends only by SIGKILL or exit 0: %v", err)
			return true
		case <-tick.C:
			if stop != nil && stop() {
				_ = cmd.Process.Kill()
			}
		case <-deadline.C:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatal("the child ran for 60 s")
			return false
		}
	}
}

// Die SIGKILLs the calling process: a crash test's child dies at the
// moment it chose, with no deferred function, no flush and no goodbye to
// any server. It does not return.
func Die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
