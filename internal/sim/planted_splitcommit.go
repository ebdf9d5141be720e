//go:build idemhttp_bug_splitcommit

package sim

func init() { planted = append(planted, "bug_splitcommit") }
