//go:build go1.26 && idemhttp_bug_unfinal

package sim

func init() { planted = append(planted, "bug_unfinal") }
