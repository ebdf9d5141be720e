//go:build idemhttp_bug_resultencoding

package contract

// bugResultEncoding: this build has the bug (see bug_resultencoding_off.go).
const bugResultEncoding = true
