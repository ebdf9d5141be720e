//go:build !unix && !windows

package wal

import (
	"errors"
	"os"
)

// CanRewrite: no atomic rename over an open file is known here.
const CanRewrite = false

// lock refuses: without a file lock, two processes could append to one
// journal and interleave their batches.
func lock(*os.File) error {
	return errors.ErrUnsupported
}

func osSyncDir(string) error { return nil }
