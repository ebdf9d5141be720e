//go:build idemhttp_bug_procdeadline

package plant

// ProcDeadline: this build has the bug (see procdeadline_off.go).
const ProcDeadline = true
