//go:build !linux

package wal

import "os"

// dsyncFlag: elsewhere each commit calls SyncData after its write.
const dsyncFlag = 0

// datasyncOS makes f's data durable. os.File.Sync is fsync, or
// F_FULLFSYNC on macOS, where plain fsync does not flush the drive's cache.
func datasyncOS(f *os.File) error { return f.Sync() }
