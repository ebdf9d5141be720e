//go:build idemhttp_bug_resumeprunes

package plant

// ResumePrunes: this build has the bug (see resumeprunes_off.go).
const ResumePrunes = true
