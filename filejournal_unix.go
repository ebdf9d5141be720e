//go:build unix

package idemhttp

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// fjCanCompact: POSIX rename replaces a file that is open.
const fjCanCompact = true

// fjLock takes an exclusive advisory lock on f without waiting. flock
// locks belong to the open file, so a second FileJournal in this process
// is refused like one in another process, and the kernel drops the lock
// when the process dies, however it dies.
func fjLock(f *os.File) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return ErrJournalLocked
	}
	return err
}

// fjSyncDir makes a file's directory entry durable, after the file was
// created or renamed.
func fjSyncDir(path string) error {
	if fjSyncDisabled {
		return nil
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
