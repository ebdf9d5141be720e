//go:build go1.26 && idemhttp_bug_splitdedup

package msgsim

func init() { planted = append(planted, "bug_splitdedup") }
