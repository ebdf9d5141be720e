//go:build idemhttp_bug_dropspace

package plant

// DropSpace: this build has the bug (see dropspace_off.go).
const DropSpace = true
