//go:build idemhttp_bug_resulturl

package contract

// bugResultURL: this build has the bug (see bug_resulturl_off.go).
const bugResultURL = true
