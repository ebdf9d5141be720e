//go:build idemhttp_nosync

package sim

func init() { planted = append(planted, "nosync") }
