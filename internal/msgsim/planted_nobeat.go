//go:build go1.26 && idemhttp_bug_nobeat

package msgsim

func init() { planted = append(planted, "bug_nobeat") }
