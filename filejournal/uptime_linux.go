package filejournal

import (
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// linuxBoot is the kernel's name for the current boot, a random UUID
// drawn at each boot, as a bootID; zero if it cannot be read.
var linuxBoot = sync.OnceValue(func() bootID {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return bootID{}
	}
	return bootOf("linux " + strings.TrimSpace(string(b)))
})

// bootClock reads CLOCK_BOOTTIME, which counts the time suspended and
// which nobody can set, at most every bootClockStep (a system call, not
// the vDSO's), and adds the process's monotonic clock since the last
// read in between: every journal operation reads the clock, and the
// evidence needs only a fraction of the slack's precision. Between two
// reads the value can only lag (the monotonic clock stops while the
// machine sleeps), never run ahead, so it never makes a set-back out of
// nothing.
var bootClock struct {
	mu   sync.Mutex
	base time.Duration // CLOCK_BOOTTIME at the last read
	at   time.Time     // the monotonic clock then
	ok   bool
}

// bootClockStep is how long bootClock extrapolates a read.
const bootClockStep = 100 * time.Millisecond

// osUptime is the machine's uptime clock: CLOCK_BOOTTIME, in the boot
// the kernel's boot id names. Without either (a sandbox that hides
// them), the process's own clock.
func osUptime() (bootID, time.Duration) {
	boot := linuxBoot()
	if boot == (bootID{}) {
		return processUptime()
	}
	now := time.Now()
	bootClock.mu.Lock()
	defer bootClock.mu.Unlock()
	if d := now.Sub(bootClock.at); bootClock.ok && d >= 0 && d < bootClockStep {
		return boot, bootClock.base + d
	}
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return processUptime()
	}
	up := time.Duration(ts.Nano())
	if bootClock.ok && up < bootClock.base+now.Sub(bootClock.at) {
		up = bootClock.base + now.Sub(bootClock.at) // never below what was handed out
	}
	bootClock.base, bootClock.at, bootClock.ok = up, now, true
	return boot, up
}
