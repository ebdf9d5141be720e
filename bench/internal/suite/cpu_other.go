//go:build !unix

package suite

import "time"

// processCPU returns 0 where getrusage does not exist (Windows): the
// benchmarks then report no server CPU time, and everything else as on
// Unix. They are measured on Linux.
func processCPU() time.Duration { return 0 }
