//go:build !linux

package filejournal_test

import (
	"testing"

	"github.com/idemkit/idemhttp/internal/needs"
)

// TestPowerCut lives in powercut_linux_test.go: it needs ext4, loop
// devices and EXT4_IOC_SHUTDOWN.
func TestPowerCut(t *testing.T) {
	needs.Missing(t, "Linux: the power-cut test cuts the power under ext4 on a loop device (EXT4_IOC_SHUTDOWN)",
		`sudo env "PATH=$PATH" go test -race -count=1 -run 'TestPowerCut$' `+needs.PkgPlaceholder+" on Linux")
}
