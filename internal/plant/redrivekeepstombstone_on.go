//go:build idemhttp_bug_redrivekeepstombstone

package plant

// RedriveKeepsTombstone: this build has the bug (see
// redrivekeepstombstone_off.go).
const RedriveKeepsTombstone = true
