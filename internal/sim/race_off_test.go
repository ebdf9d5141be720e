//go:build go1.26 && !race

package sim

// raceEnabled: see race_on_test.go.
const raceEnabled = false
