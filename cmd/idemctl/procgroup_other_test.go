//go:build !unix

package main

import "os/exec"

// setProcessGroup does nothing where there are no process groups; the
// tests that need them skip there.
func setProcessGroup(*exec.Cmd) {}

// killProcessGroup kills cmd alone.
func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
