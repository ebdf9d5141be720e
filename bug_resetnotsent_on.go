//go:build idemhttp_bug_resetnotsent

package idemhttp

import (
	"errors"
	"syscall"
)

// bugResetNotSent: this build takes a reset for "not sent" (see
// bug_resetnotsent_off.go). It exists only so the simulator can show it
// finds the bug; never ship it.
const bugResetNotSent = true

// bugIsReset reports whether err is a connection reset.
func bugIsReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
