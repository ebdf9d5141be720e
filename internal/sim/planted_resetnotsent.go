//go:build idemhttp_bug_resetnotsent

package sim

func init() { planted = append(planted, "bug_resetnotsent") }
