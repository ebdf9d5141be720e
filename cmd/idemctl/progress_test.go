package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestProgressLines(t *testing.T) {
	var out strings.Builder
	p := newProgress(&out, "auto", 3, false)
	now := time.Unix(0, 0)
	p.now = func() time.Time { return now }
	p.last = now

	p.add(&result{Result: resultOK})
	now = now.Add(3 * time.Second) // past the interval: the next add prints
	p.add(&result{Result: resultPending})
	p.add(&result{Result: resultFailed, Skipped: true})
	got := p.finish()

	assert.Equal(t, "idemctl: progress 2/3 (66%): 1 ok, 0 failed, 1 pending\n"+
		"idemctl: progress 3/3 (100%): 1 ok, 1 failed, 1 pending\n", out.String())
	assert.Equal(t, tally{ok: 1, failed: 1, pending: 1, skipped: 1}, got)
}

func TestProgressBar(t *testing.T) {
	var out strings.Builder
	p := newProgress(&out, "auto", 2, true)

	p.add(&result{Result: resultOK, Replayed: true})
	p.printf("a message\n")
	p.add(&result{Result: resultOK})
	got := p.finish()

	assert.Contains(t, out.String(), "operations")
	assert.Contains(t, out.String(), "a message\n")
	assert.Equal(t, tally{ok: 2, replayed: 1}, got)
}

func TestProgressNone(t *testing.T) {
	var out strings.Builder
	p := newProgress(&out, "none", 1, true)

	p.add(&result{Result: resultOK})
	p.finish()

	assert.Empty(t, out.String())
}
