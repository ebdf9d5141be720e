package wal

import "os"

// hookFS is OS with OpenFile replaced: for a test that needs one open to
// fail, or to name another file than the path does.
type hookFS struct {
	OS
	open func(name string, flag int, perm os.FileMode, dsync bool) (File, error)
}

func (h hookFS) OpenFile(name string, flag int, perm os.FileMode, dsync bool) (File, error) {
	return h.open(name, flag, perm, dsync)
}
