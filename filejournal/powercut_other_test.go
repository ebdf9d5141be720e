//go:build !linux

package filejournal_test

import "testing"

// TestPowerCut lives in powercut_linux_test.go: it needs ext4, loop
// devices and EXT4_IOC_SHUTDOWN.
func TestPowerCut(t *testing.T) {
	t.Skip("power-cut test needs Linux (ext4 on a loop device, EXT4_IOC_SHUTDOWN)")
}
