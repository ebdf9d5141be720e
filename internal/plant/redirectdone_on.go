//go:build idemhttp_bug_redirectdone

package plant

// RedirectDone: this build has the bug (see redirectdone_off.go).
const RedirectDone = true
