//go:build go1.26 && idemhttp_bug_giveupdone

package sim

func init() { planted = append(planted, "bug_giveupdone") }
