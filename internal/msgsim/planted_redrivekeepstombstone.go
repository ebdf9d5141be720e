//go:build go1.26 && idemhttp_bug_redrivekeepstombstone

package msgsim

func init() { planted = append(planted, "bug_redrivekeepstombstone") }
