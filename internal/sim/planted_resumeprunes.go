//go:build go1.26 && idemhttp_bug_resumeprunes

package sim

func init() { planted = append(planted, "bug_resumeprunes") }
