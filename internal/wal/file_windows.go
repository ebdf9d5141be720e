//go:build windows

package wal

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// CanRewrite: Windows cannot rename over a file that is open.
const CanRewrite = false

// lock takes an exclusive lock on f without waiting.
func lock(f *os.File) error {
	ol := new(windows.Overlapped)
	err := windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return ErrLocked
	}
	return err
}

// osSyncDir is a no-op: NTFS makes a file's creation durable with its
// metadata.
func osSyncDir(string) error { return nil }
