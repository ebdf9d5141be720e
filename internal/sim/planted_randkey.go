//go:build go1.26 && idemhttp_bug_randkey

package sim

func init() { planted = append(planted, "bug_randkey") }
