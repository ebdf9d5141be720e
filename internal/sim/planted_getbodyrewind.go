//go:build go1.26 && idemhttp_bug_getbodyrewind

package sim

func init() { planted = append(planted, "bug_getbodyrewind") }
