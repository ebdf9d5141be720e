//go:build idemhttp_bug_clockback

package plant

// ClockBack: this build has the bug (see clockback_off.go).
const ClockBack = true
