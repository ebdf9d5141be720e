//go:build !linux

package wal

import "os"

// syncFlag: elsewhere each commit calls datasync after its write.
func syncFlag() int { return 0 }

// writeSyncs: a write alone is not durable here.
func writeSyncs() bool { return false }

// datasync makes f's data durable. os.File.Sync is fsync, or
// F_FULLFSYNC on macOS, where plain fsync does not flush the drive's cache.
func datasync(f *os.File) error {
	if syncDisabled {
		return nil
	}
	return f.Sync()
}
