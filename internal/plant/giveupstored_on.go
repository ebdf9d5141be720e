//go:build idemhttp_bug_giveupstored

package plant

// GiveUpStored: this build has the bug (see giveupstored_off.go).
const GiveUpStored = true
