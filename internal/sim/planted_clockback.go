//go:build go1.26 && idemhttp_bug_clockback

package sim

func init() { planted = append(planted, "bug_clockback") }
