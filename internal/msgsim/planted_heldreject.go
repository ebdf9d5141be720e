//go:build go1.26 && idemhttp_bug_heldreject

package msgsim

func init() { planted = append(planted, "bug_heldreject") }
