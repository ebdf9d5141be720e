//go:build !idemhttp_bug_clockback

package plant

// ClockBack, with the idemhttp_bug_clockback build tag: idemserver's
// renewer follows its process's clock back when it is set back (its
// steady clock off): every renewal due after the latest reading waits
// until the clock has caught up again, the claim's lock runs out in the
// store meanwhile, and a retry runs the handler beside the one still
// running; a Complete after the handler is tried again for as long as the
// clock went back.
const ClockBack = false
