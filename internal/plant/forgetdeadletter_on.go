//go:build idemhttp_bug_forgetdeadletter

package plant

// ForgetDeadLetter: this build has the bug (see forgetdeadletter_off.go).
const ForgetDeadLetter = true
