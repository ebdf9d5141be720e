//go:build go1.26 && race

package sim

// raceEnabled: the race detector slows a seed down five to ten times.
const raceEnabled = true
