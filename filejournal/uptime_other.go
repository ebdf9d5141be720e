//go:build !linux

package filejournal

import "time"

// osUptime is the process's own clock: without a boot id and a boot
// clock that the journal can read portably, evidence lasts as long as
// the process.
func osUptime() (bootID, time.Duration) { return processUptime() }
