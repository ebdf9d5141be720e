//go:build go1.26

package sim

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idemhttp/internal/shrink"
)

// Shrink looks for a smaller world that breaks the same invariant with
// the same seed: fewer operations, workers and steps, each fault off,
// fewer crashes, as long as the failure stays. It runs at most budget
// worlds, and returns the smallest and its result.
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

// Unknown returns r's failures that no known bug explains.
func Unknown(r *Result) []Failure {
	var out []Failure
	for _, f := range r.Failures {
		if f.Known == "" && f.Limit == "" {
			out = append(out, f)
		}
	}
	return out
}

// smaller returns the worlds one step smaller than c, the biggest cuts
// first.
func smaller(c Config) []Config {
	var out []Config
	edit := func(f func(*Config)) {
		d := c
		f(&d)
		if d != c {
			out = append(out, d)
		}
	}
	edit(func(d *Config) { d.Steps /= 2 })
	edit(func(d *Config) {
		if d.Ops > 1 {
			d.Ops--
			d.Dups = min(d.Dups, d.Ops)
		}
	})
	edit(func(d *Config) {
		if d.Dups > 0 {
			d.Dups--
		}
	})
	edit(func(d *Config) {
		if d.Workers > 1 {
			d.Workers--
		}
	})
	edit(func(d *Config) {
		if d.ClientCrashes > 0 {
			d.ClientCrashes--
		}
	})
	edit(func(d *Config) {
		if d.ServerCrashes > 0 {
			d.ServerCrashes--
		}
	})
	// Every fault, one at a time, off.
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		if strings.Contains("Ops Dups Workers Steps MaxAttempts ClientCrashes ServerCrashes Torn", name) {
			continue
		}
		edit(func(d *Config) {
			f := reflect.ValueOf(d).Elem().Field(i)
			if f.Kind() == reflect.Bool {
				f.SetBool(false)
			} else {
				f.SetInt(0)
			}
		})
	}
	edit(func(d *Config) { d.Torn = 0 })
	edit(func(d *Config) { d.Steps = d.Steps * 3 / 4 })
	return out
}

// Shorten returns the lines of r's trace that tell its failure: those
// about the operations it names, the crashes, restarts and jumps, and
// the failure itself.
func Shorten(r *Result) []string {
	ops := map[int]bool{}
	for _, f := range r.Failures {
		ops[f.Op] = true
	}
	var out []string
	for _, l := range r.Trace {
		if keep(l, ops) {
			out = append(out, l)
		}
	}
	return out
}

func keep(l string, ops map[int]bool) bool {
	for _, s := range []string{"FAIL", "disk:", "crash", "power cut", "killed", "starts", "exits", "closes", " up", "clock", "recovery", "resume", "a day", "the server:", "cut off"} {
		if strings.Contains(l, s) {
			return true
		}
	}
	for op := range ops {
		if op < 0 {
			return true
		}
		for _, s := range []string{"op " + strconv.Itoa(op) + ":", "op " + strconv.Itoa(op) + " ", "op" + strconv.Itoa(op) + ".sim", "k-" + strconv.Itoa(op) + "-"} {
			if strings.Contains(l, s) {
				return true
			}
		}
	}
	return false
}
