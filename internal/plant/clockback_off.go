//go:build !idemhttp_bug_clockback

package plant

// ClockBack, with the idemhttp_bug_clockback build tag: the clock
// idemserver's renewer is given through the simulator's seam follows the
// process's clock back when it is set back (its steadiness off): a
// Complete after the handler is tried again, and every renewal waits, for
// as long as the clock went back, measured from a reading taken before
// the set-back.
const ClockBack = false
