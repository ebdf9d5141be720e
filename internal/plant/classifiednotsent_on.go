//go:build idemhttp_bug_classifiednotsent

package plant

// ClassifiedNotSent: this build has the bug (see classifiednotsent_off.go).
const ClassifiedNotSent = true
