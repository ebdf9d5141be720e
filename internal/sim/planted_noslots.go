//go:build idemhttp_bug_noslots

package sim

func init() { planted = append(planted, "bug_noslots") }
