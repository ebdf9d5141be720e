//go:build idemhttp_bug_completeonce

package plant

// CompleteOnce: this build has the bug (see completeonce_off.go).
const CompleteOnce = true
