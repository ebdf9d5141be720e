//go:build go1.26 && idemhttp_bug_newkey

package sim

func init() { planted = append(planted, "bug_newkey") }
