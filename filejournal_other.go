//go:build !unix && !windows

package idemhttp

import (
	"errors"
	"os"
)

const fjCanCompact = false

// fjLock refuses: without a file lock, two processes could append to one
// journal and interleave their batches.
func fjLock(*os.File) error {
	return errors.ErrUnsupported
}

func fjSyncDir(string) error { return nil }
