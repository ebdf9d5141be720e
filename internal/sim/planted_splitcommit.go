//go:build go1.26 && idemhttp_bug_splitcommit

package sim

func init() { planted = append(planted, "bug_splitcommit") }
