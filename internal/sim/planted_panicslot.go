//go:build go1.26 && idemhttp_bug_panicslot

package sim

func init() { planted = append(planted, "bug_panicslot") }
