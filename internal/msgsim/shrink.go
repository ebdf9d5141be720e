//go:build go1.26

package msgsim

import (
	"strings"
	"testing"

	"github.com/idemkit/idemhttp/internal/shrink"
)

// Shrink looks for a smaller world that breaks the same invariant with
// the same seed (fewer steps, messages, consumers, crashes; each fault
// and behaviour off in turn), as internal/sim's shrinker does; it runs at
// most budget worlds and returns the smallest and its result
// (internal/shrink's search, which internal/sim's uses too).
func Shrink(t *testing.T, seed uint64, cfg Config, inv string, budget int) (Config, *Result) {
	return ShrinkBy(t, seed, cfg, func(r *Result) bool { return breaks(r, inv) }, budget)
}

// ShrinkBy is Shrink for the failure fails recognises.
func ShrinkBy(t *testing.T, seed uint64, cfg Config, fails func(*Result) bool, budget int) (Config, *Result) {
	run := func(c Config) *Result { return RunSeed(t, seed, c) }
	return shrink.Greedy(cfg, run, fails, smaller, budget)
}

func breaks(r *Result, inv string) bool {
	for _, f := range Unknown(r) {
		if f.Inv == inv {
			return true
		}
	}
	return false
}

// Unknown returns r's failures that no known limit explains.
func Unknown(r *Result) []Failure {
	var out []Failure
	for _, f := range r.Failures {
		if f.Known == "" {
			out = append(out, f)
		}
	}
	return out
}

// Shorten returns the lines of r's trace that tell its first failure:
// those about the message it names, the crashes, shutdowns, restarts,
// rebalances, the database and the failure itself.
func Shorten(r *Result) []string {
	msg := ""
	if u := Unknown(r); len(u) > 0 {
		msg = u[0].Msg
	}
	var out []string
	for _, l := range r.Trace {
		keep := msg == "" || strings.Contains(l, " "+msg+" ") || strings.Contains(l, " "+msg+",") || strings.Contains(l, " "+msg+":") || strings.HasSuffix(l, " "+msg)
		for _, s := range []string{"FAIL", "crash", "shuts down", "starts", "database", "partition", "recovery", "ack wait"} {
			keep = keep || strings.Contains(l, s)
		}
		if keep {
			out = append(out, l)
		}
	}
	return out
}
