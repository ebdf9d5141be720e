//go:build windows

package idemhttp

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// fjCanCompact: Windows cannot rename over a file that is open.
const fjCanCompact = false

// fjLock takes an exclusive lock on f without waiting.
func fjLock(f *os.File) error {
	ol := new(windows.Overlapped)
	err := windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return ErrJournalLocked
	}
	return err
}

// fjSyncDir is a no-op: NTFS makes a file's creation durable with its
// metadata.
func fjSyncDir(string) error { return nil }
