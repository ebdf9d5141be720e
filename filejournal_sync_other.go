//go:build !linux

package idemhttp

import "os"

// fjSyncFlag: elsewhere each commit calls fjDatasync after its write.
const fjSyncFlag = 0

// fjDatasync makes f's data durable. os.File.Sync is fsync, or
// F_FULLFSYNC on macOS, where plain fsync does not flush the drive's cache.
func fjDatasync(f *os.File) error {
	if fjSyncDisabled {
		return nil
	}
	return f.Sync()
}
