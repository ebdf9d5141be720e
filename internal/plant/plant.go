// Package plant holds the simulator's planted bugs (internal/sim;
// docs/simulation.md): test-only switches, one build tag each, that put a
// real class of bug back into the client so that the simulator can show
// that it finds it, as internal/wal's idemhttp_nosync does for the
// journal's syncs. Without its tag each switch is a false constant, and
// the compiler drops the code it guards. Never ship a build with one.
package plant

import (
	"errors"
	"strconv"
	"syscall"
)

// RetryKey is the key a build with [RetryNewKey] sends attempt number
// attempt of an operation keyed key under: a key of its own, derived, so
// that runs stay reproducible.
func RetryKey(key string, attempt int) string { return key + "-retry-" + strconv.Itoa(attempt) }

// IsReset reports whether err is a connection reset, which a build with
// [ResetNotSent] takes for "not sent".
func IsReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
