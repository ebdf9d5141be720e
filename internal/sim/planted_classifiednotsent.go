//go:build go1.26 && idemhttp_bug_classifiednotsent

package sim

func init() { planted = append(planted, "bug_classifiednotsent") }
