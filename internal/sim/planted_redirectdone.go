//go:build go1.26 && idemhttp_bug_redirectdone

package sim

func init() { planted = append(planted, "bug_redirectdone") }
