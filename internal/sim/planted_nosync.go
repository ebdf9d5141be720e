//go:build go1.26 && idemhttp_nosync

package sim

func init() { planted = append(planted, "nosync") }
