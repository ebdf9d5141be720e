//go:build idemhttp_bug_getbodyrewind

package plant

// GetBodyRewind: this build has the bug (see getbodyrewind_off.go).
const GetBodyRewind = true
