//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// setProcessGroup makes cmd the leader of a process group of its own,
// so that killProcessGroup reaches what it starts in the background.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killProcessGroup kills cmd's process group, if it started.
func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
