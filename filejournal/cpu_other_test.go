//go:build !unix

package filejournal_test

import "time"

// benchCPUTime is 0 where the process's CPU time is not read: the
// benchmarks then report wall time only.
func benchCPUTime() time.Duration { return 0 }
