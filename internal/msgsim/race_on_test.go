//go:build go1.26 && race

package msgsim

const raceEnabled = true
