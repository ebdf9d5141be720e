//go:build go1.26 && idemhttp_bug_hijackstored

package sim

func init() { planted = append(planted, "bug_hijackstored") }
