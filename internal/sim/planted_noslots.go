//go:build go1.26 && idemhttp_bug_noslots

package sim

func init() { planted = append(planted, "bug_noslots") }
