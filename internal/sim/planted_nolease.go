//go:build go1.26 && idemhttp_bug_nolease

package sim

func init() { planted = append(planted, "bug_nolease") }
