//go:build go1.26 && idemhttp_bug_resetnotsent

package sim

func init() { planted = append(planted, "bug_resetnotsent") }
