package filejournal

import (
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// linuxBoot is the kernel's name for the current boot, a random UUID
// drawn at each boot; "" if it cannot be read.
var linuxBoot = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// osUptime is the machine's uptime clock: CLOCK_BOOTTIME, which counts
// the time suspended and which nobody can set, in the boot the kernel's
// boot id names. Without either (a sandbox that hides them), the
// process's own clock.
func osUptime() (bootID, time.Duration) {
	boot := linuxBoot()
	var ts unix.Timespec
	if boot == "" || unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return processUptime()
	}
	return bootOf("linux " + boot), time.Duration(ts.Nano())
}
