//go:build go1.26

package msgsim

// planted lists the planted bugs this build has (each planted_*.go file,
// built with its tag, adds its name): the simulator must find them.
var planted []string
