//go:build go1.26 && idemhttp_bug_countshutdowns

package msgsim

func init() { planted = append(planted, "bug_countshutdowns") }
