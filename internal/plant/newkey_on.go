//go:build idemhttp_bug_newkey

package plant

// RetryNewKey: this build has the bug (see newkey_off.go).
const RetryNewKey = true
