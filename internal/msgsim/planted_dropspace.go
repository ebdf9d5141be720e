//go:build go1.26 && idemhttp_bug_dropspace

package msgsim

func init() { planted = append(planted, "bug_dropspace") }
