//go:build go1.26 && idemhttp_bug_ackfirst

package msgsim

func init() { planted = append(planted, "bug_ackfirst") }
