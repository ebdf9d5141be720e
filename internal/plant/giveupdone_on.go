//go:build idemhttp_bug_giveupdone

package plant

// GiveUpDone: this build has the bug (see giveupdone_off.go).
const GiveUpDone = true
