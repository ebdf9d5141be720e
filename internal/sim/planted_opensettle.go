//go:build go1.26 && idemhttp_bug_opensettle

package sim

func init() { planted = append(planted, "bug_opensettle") }
