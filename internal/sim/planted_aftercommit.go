//go:build go1.26 && idemhttp_bug_aftercommit

package sim

func init() { planted = append(planted, "bug_aftercommit") }
