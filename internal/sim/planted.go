//go:build go1.26

package sim

// planted lists the planted bugs this build has (their build tags, each
// file of which adds its name): the simulator must find them.
var planted []string
