//go:build unix

package suite

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time, user and system, that this process has
// used: all its threads, the garbage collector's included.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
