//go:build idemhttp_bug_batchnotombstone

package plant

// BatchNoTombstone: this build has the bug (see batchnotombstone_off.go).
const BatchNoTombstone = true
