package wal

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// viewerByte is the byte of a journal file that read-only opens hold a
// shared open-file-description lock on (far past any real data; a lock
// needs no data there), so that a writer can tell whether anyone still
// reads a file it has replaced. Writers take their exclusive lock with
// flock, which these fcntl locks do not interact with.
const viewerByte = 1 << 62

// lockViewer takes a read-only open's shared lock on f. ErrLocked means
// a writer is freeing this file: it was replaced, and the path names
// another one now.
func lockViewer(f *os.File) error {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: viewerByte, Len: 1}
	err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return ErrLocked
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOLCK) {
		return nil // no OFD locks here: writers then never free a file early
	}
	return err
}

// freeStep and freePause pace the freeing of a replaced file.
const (
	freeStep  = 32 << 20
	freePause = 2 * time.Millisecond
)

// freeReplaced closes old, the file a rewrite replaced (the rename
// unlinked it), freeing its blocks a step at a time first when nobody
// else has it open for reading. Freeing a large file at once, in the
// last close, made the file system's journal commit that carried it slow
// for every sync queued behind it: Begins waited 50 to 110 ms behind the
// close of a 1.2 GB journal. Truncating it from the end, 32 MiB at a
// time with a pause between, spreads that over many small commits.
//
// A read-only open may still read the old file (it shows the file as it
// was when opened): it holds a shared lock on viewerByte, and then the
// file is left whole for the kernel to free when the last reader closes
// it. The exclusive lock taken here, kept until the close, makes a
// read-only open that raced the rename fail its lock and open the new
// file instead (see openReadOnly).
func freeReplaced(old *os.File) {
	defer old.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: viewerByte, Len: 1}
	if err := unix.FcntlFlock(old.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		return // a reader has it, or no OFD locks: the close frees it
	}
	fi, err := old.Stat()
	if err != nil {
		return
	}
	for size := fi.Size(); size > 0; {
		size = max(0, size-freeStep)
		if old.Truncate(size) != nil {
			return
		}
		if size > 0 {
			time.Sleep(freePause)
		}
	}
}
