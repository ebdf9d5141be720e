//go:build go1.26 && idemhttp_bug_resulturl

package sim

func init() { planted = append(planted, "bug_resulturl") }
