package wal

import (
	"errors"
	"os"
	"path/filepath"
)

// FS is the file system under a [Log]: every file access of the log
// goes through one, so that a test can put a simulated or a
// fault-injecting disk under it (see [Options.FS]). It covers exactly
// what the log does: open with flags, stat and file identity, rename,
// remove, the directory sync, and symlink resolution. [OS] is the
// operating system's; the simulated disk of internal/wal/simdisk is the
// other.
//
// Errors are those of package os, or wrap them: a missing file is
// [os.ErrNotExist] to [errors.Is], a full disk wraps syscall.ENOSPC. An
// FS is used by the log's goroutines concurrently.
type FS interface {
	// OpenFile opens name as [os.OpenFile] does, with flag made of
	// os.O_RDONLY, os.O_WRONLY, os.O_RDWR, os.O_CREATE, os.O_EXCL and
	// os.O_TRUNC. With dsync, every write through the file is asked to
	// be durable when it returns (O_DSYNC); [File.WriteSyncs] says
	// whether it is.
	OpenFile(name string, flag int, perm os.FileMode, dsync bool) (File, error)

	// Stat returns what the path names now (following symlinks).
	Stat(name string) (os.FileInfo, error)

	// SameFile reports whether a and b, from this FS's Stat and
	// [File.Stat], describe the same file (inode), as [os.SameFile].
	SameFile(a, b os.FileInfo) bool

	// Rename renames oldpath to newpath, replacing what newpath names,
	// atomically. Like any change to a directory, it is durable only
	// once the directory is synced.
	Rename(oldpath, newpath string) error

	// Remove removes the named file.
	Remove(name string) error

	// SyncDir makes the entries of the directory dir (files created,
	// renamed, removed) durable.
	SyncDir(dir string) error

	// EvalSymlinks returns the path name after resolving symlinks, as
	// [filepath.EvalSymlinks].
	EvalSymlinks(name string) (string, error)
}

// createTries bounds the names [CreateNew] tries.
const createTries = 100

// CreateNew creates a file on fs that did not exist, mode 0600 and open
// for writing (os.O_CREATE|os.O_EXCL, so that no file already there, a
// crashed process's or another writer's, is reused or truncated). It
// tries name(0), name(1) and so on, in that order, up to name(99),
// calling name once per try, and returns the first file it could create
// with its name. It returns the error of the first try that fails for
// another reason than the file existing, or, when all 100 exist, one
// wrapping [os.ErrExist]. The caller closes the file.
func CreateNew(fs FS, name func(i int) string) (File, string, error) {
	var err error
	for i := range createTries {
		n := name(i)
		var f File
		f, err = fs.OpenFile(n, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600, false)
		if err == nil {
			return f, n, nil
		}
		if !errors.Is(err, os.ErrExist) {
			break
		}
	}
	return nil, "", err
}

// File is an open file of an [FS]. The log reads and writes it at
// offsets only; reads may run concurrently with each other and with one
// writer. Close releases its locks.
type File interface {
	// ReadAt and WriteAt read and write at an offset, as [os.File]'s do.
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)

	// Close closes the file, releasing its locks.
	Close() error

	// Stat describes the file, for its size, its mode and
	// [FS.SameFile].
	Stat() (os.FileInfo, error)

	// Truncate changes the file's size, as [os.File.Truncate].
	Truncate(size int64) error

	// Chmod changes the file's mode, as [os.File.Chmod].
	Chmod(mode os.FileMode) error

	// SyncData makes the file's data, and the size needed to read it
	// back, durable (fdatasync). After a failed SyncData, nothing
	// written since the last successful one may be taken as durable,
	// even if a later SyncData succeeds.
	SyncData() error

	// WriteSyncs reports whether each WriteAt is durable when it returns
	// (the file was opened with dsync, and the FS offers it), so that no
	// SyncData needs to follow it.
	WriteSyncs() bool

	// WriteBack writes the n bytes at off out to the disk and waits for
	// them, without making anything durable: a hint, so that a later
	// SyncData has little left to write. It may do nothing.
	WriteBack(off, n int64) error

	// Lock takes the writer's exclusive lock on the file without
	// waiting: [ErrLocked] if another open file holds it. It lasts until
	// Close, or until the process dies.
	Lock() error

	// LockViewer takes a read-only open's shared lock, which makes a
	// writer that replaced the file leave it whole (see CloseReplaced).
	// ErrLocked means a writer is freeing this file: it was replaced. An
	// FS without such locks returns nil.
	LockViewer() error

	// CloseReplaced closes a file that a rename has replaced (and so
	// unlinked), first freeing its blocks a step at a time when no
	// read-only open still reads it, so that the file system need not
	// free a large file at once. The freeing is best effort: its errors
	// are not reported.
	CloseReplaced()
}

// OS is the operating system's file system: package os, flock and
// open-file-description locks, fdatasync and O_DSYNC on Linux (fsync, or
// F_FULLFSYNC on macOS, elsewhere), sync_file_range for WriteBack, and
// paced truncation of a replaced file. The zero value is ready to use;
// it has no state.
type OS struct{}

var _ FS = OS{}

// OpenFile is [os.OpenFile]; dsync adds O_DSYNC on Linux. Elsewhere no
// write syncs, and the log calls SyncData after each.
func (OS) OpenFile(name string, flag int, perm os.FileMode, dsync bool) (File, error) {
	if dsync {
		flag |= dsyncFlag
	}
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &osFile{f: f, dsync: dsync && dsyncFlag != 0}, nil
}

// Stat is [os.Stat].
func (OS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }

// SameFile is [os.SameFile].
func (OS) SameFile(a, b os.FileInfo) bool { return os.SameFile(a, b) }

// Rename is [os.Rename].
func (OS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

// Remove is [os.Remove].
func (OS) Remove(name string) error { return os.Remove(name) }

// SyncDir opens dir and syncs it (a no-op on Windows, where NTFS makes
// a file's creation durable with its metadata).
func (OS) SyncDir(dir string) error { return osSyncDir(dir) }

// EvalSymlinks is [filepath.EvalSymlinks].
func (OS) EvalSymlinks(name string) (string, error) { return filepath.EvalSymlinks(name) }

// osFile is a File of OS.
type osFile struct {
	f     *os.File
	dsync bool // opened with O_DSYNC
}

func (f *osFile) ReadAt(p []byte, off int64) (int, error)  { return f.f.ReadAt(p, off) }
func (f *osFile) WriteAt(p []byte, off int64) (int, error) { return f.f.WriteAt(p, off) }
func (f *osFile) Close() error                             { return f.f.Close() }
func (f *osFile) Stat() (os.FileInfo, error)               { return f.f.Stat() }
func (f *osFile) Truncate(size int64) error                { return f.f.Truncate(size) }
func (f *osFile) Chmod(mode os.FileMode) error             { return f.f.Chmod(mode) }
func (f *osFile) SyncData() error                          { return datasyncOS(f.f) }
func (f *osFile) WriteSyncs() bool                         { return f.dsync }
func (f *osFile) WriteBack(off, n int64) error             { return writeback(f.f, off, n) }
func (f *osFile) Lock() error                              { return lock(f.f) }
func (f *osFile) LockViewer() error                        { return lockViewer(f.f) }
func (f *osFile) CloseReplaced()                           { freeReplaced(f.f) }

// fsOf is opts' FS, OS if none.
func fsOf(opts *Options) FS {
	if opts.FS == nil {
		return OS{}
	}
	return opts.FS
}

// The sync switch. Every durability call of the log goes through these,
// whatever the FS, so that the idemhttp_nosync control build turns off
// the syncs of a simulated disk as it does those of the OS.

// datasync makes f's data durable, unless this build never syncs.
func datasync(f File) error {
	if syncDisabled {
		return nil
	}
	return f.SyncData()
}

// syncDir makes the directory entry of the file at path durable, after
// it was created or renamed, unless this build never syncs.
func syncDir(fs FS, path string) error {
	if syncDisabled {
		return nil
	}
	return fs.SyncDir(filepath.Dir(path))
}

// writeBack is File.WriteBack, unless this build never syncs.
func writeBack(f File, off, n int64) error {
	if syncDisabled {
		return nil
	}
	return f.WriteBack(off, n)
}

// dsync is whether the log asks for synchronous writes: not in a build
// that never syncs.
const dsync = !syncDisabled
