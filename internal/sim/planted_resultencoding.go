//go:build go1.26 && idemhttp_bug_resultencoding

package sim

func init() { planted = append(planted, "bug_resultencoding") }
