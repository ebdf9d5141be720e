//go:build go1.26 && idemhttp_bug_completeonce

package sim

func init() { planted = append(planted, "bug_completeonce") }
