//go:build go1.26 && idemhttp_bug_prunemillis

package msgsim

func init() { planted = append(planted, "bug_prunemillis") }
