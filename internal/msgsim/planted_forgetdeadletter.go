//go:build go1.26 && idemhttp_bug_forgetdeadletter

package msgsim

func init() { planted = append(planted, "bug_forgetdeadletter") }
