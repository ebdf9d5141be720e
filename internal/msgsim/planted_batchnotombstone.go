//go:build go1.26 && idemhttp_bug_batchnotombstone

package msgsim

func init() { planted = append(planted, "bug_batchnotombstone") }
