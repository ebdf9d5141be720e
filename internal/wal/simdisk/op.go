package simdisk

// OpKind is the kind of a call into a [Disk].
type OpKind int

// The calls a [Fault] sees.
const (
	OpOpen      OpKind = iota + 1 // FS.OpenFile
	OpStat                        // FS.Stat and File.Stat
	OpRename                      // FS.Rename
	OpRemove                      // FS.Remove
	OpSyncDir                     // FS.SyncDir
	OpRead                        // File.ReadAt
	OpWrite                       // File.WriteAt
	OpSync                        // File.SyncData, and the sync half of a write through a dsync file
	OpTruncate                    // File.Truncate, and CloseReplaced's
	OpChmod                       // File.Chmod
	OpWriteBack                   // File.WriteBack
	OpLock                        // File.Lock and File.LockViewer
)

var opNames = [...]string{
	OpOpen: "open", OpStat: "stat", OpRename: "rename", OpRemove: "remove", OpSyncDir: "syncdir",
	OpRead: "read", OpWrite: "write", OpSync: "sync", OpTruncate: "truncate", OpChmod: "chmod",
	OpWriteBack: "writeback", OpLock: "lock",
}

// String is the kind's name: "write", "sync", ...
func (k OpKind) String() string {
	if k > 0 && int(k) < len(opNames) {
		return opNames[k]
	}
	return "op?"
}

// Op is one call into a [Disk], as a [Fault] sees it.
type Op struct {
	Seq     int    // 1 for the disk's first call since New, counting every call
	Kind    OpKind // what is called
	Path    string // the file's path (as opened), or the directory's for OpSyncDir
	NewPath string // OpRename's new path
	Flag    int    // OpOpen's flags
	Off     int64  // OpRead's, OpWrite's, OpWriteBack's offset; OpTruncate's size
	Len     int    // OpRead's, OpWrite's, OpWriteBack's length, and a dsync write's OpSync's
}

// Fault decides, before each call into a [Disk], whether it fails: it
// returns the error the call returns (wrapped in an *os.PathError or
// *os.LinkError), or nil. A failed call changes nothing, except a failed
// sync, which drops what it would have made durable (see
// [wal.File.SyncData]). An error wrapping [ErrHalted] cuts the power at
// that call, as [Disk.HaltAt] does. A Fault is called with the disk
// locked, from whichever goroutine calls the disk: it must not call the
// disk.
type Fault func(op Op) error

// FailNth is a Fault failing the nth call of kind (1 for the first)
// with err, and no other.
func FailNth(kind OpKind, n int, err error) Fault {
	seen := 0
	return func(op Op) error {
		if op.Kind != kind {
			return nil
		}
		seen++
		if seen == n {
			return err
		}
		return nil
	}
}

// FailFrom is a Fault failing the nth call of kind and every later one
// with err: a disk that stays full, or a sector that stays bad.
func FailFrom(kind OpKind, n int, err error) Fault {
	seen := 0
	return func(op Op) error {
		if op.Kind != kind {
			return nil
		}
		seen++
		if seen >= n {
			return err
		}
		return nil
	}
}
