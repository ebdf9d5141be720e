// Package shrink is the simulators' shrinker (internal/sim, internal/msgsim):
// the greedy search for a smaller world that still fails, on any world and
// result type.
package shrink

// Greedy runs the world cfg and, while it fails, tries the smaller worlds
// smaller proposes, in turn, keeping the first that still fails, until none
// does or budget worlds have run. It returns the smallest failing world and
// its result, or cfg and its result when cfg does not fail.
func Greedy[C, R any](cfg C, run func(C) R, fails func(R) bool, smaller func(C) []C, budget int) (C, R) {
	best := run(cfg)
	if !fails(best) {
		return cfg, best
	}
	runs := 1
	for improved := true; improved && runs < budget; {
		improved = false
		for _, cand := range smaller(cfg) {
			if runs >= budget {
				break
			}
			runs++
			if res := run(cand); fails(res) {
				cfg, best, improved = cand, res, true
				break
			}
		}
	}
	return cfg, best
}
