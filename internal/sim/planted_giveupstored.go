//go:build go1.26 && idemhttp_bug_giveupstored

package sim

func init() { planted = append(planted, "bug_giveupstored") }
