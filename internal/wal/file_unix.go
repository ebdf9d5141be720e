//go:build unix

package wal

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// CanRewrite: POSIX rename replaces a file that is open.
const CanRewrite = true

// lock takes an exclusive advisory lock on f without waiting. flock
// locks belong to the open file, so a second writer in this process is
// refused like one in another process, and the kernel drops the lock
// when the process dies, however it dies.
func lock(f *os.File) error {
	err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return ErrLocked
	}
	return err
}

// osSyncDir makes the entries of directory dir durable, after a file in
// it was created or renamed.
func osSyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
