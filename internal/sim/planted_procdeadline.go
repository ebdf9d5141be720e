//go:build go1.26 && idemhttp_bug_procdeadline

package sim

func init() { planted = append(planted, "bug_procdeadline") }
