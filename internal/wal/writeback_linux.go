package wal

import (
	"os"

	"golang.org/x/sys/unix"
)

// writebackStep is how much of a rewrite's data writeback pushes to the
// disk at a time.
const writebackStep = 1 << 20

// writeback writes the n bytes of f at off out to the disk and waits for
// them, a MiB at a time, without syncing anything else (no metadata, no
// journal commit, no cache flush: the final fdatasync does that). A
// rewrite calls it after each of its writes, so that the data it leaves
// for that sync, and for the file system's next journal commit, stays
// small: a commit's sync, which may have to wait for whatever data is
// being written back, then waits for at most about a MiB of the rewrite's,
// not for the hundreds it would otherwise leave dirty (measured: a Begin
// waited 115 ms for the final sync of a 275 MB rewrite).
func writeback(f *os.File, off, n int64) error {
	for n > 0 {
		k := min(n, writebackStep)
		for {
			err := unix.SyncFileRange(int(f.Fd()), off, k, unix.SYNC_FILE_RANGE_WRITE_AND_WAIT)
			if err == nil {
				break
			}
			if err != unix.EINTR {
				return err
			}
		}
		off, n = off+k, n-k
	}
	return nil
}
