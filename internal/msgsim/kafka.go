//go:build go1.26

package msgsim

import (
	"context"
	"sort"
	"strconv"
	"time"

	"github.com/idemkit/idemhttp/inbox"
)

// topic is the modelled Kafka topic: partitions of records, each owned by
// one member of the consumer group at a time (its generation counts the
// assignments), with a committed offset; a member's commit of a partition
// it no longer owns is refused (Kafka's illegal generation). A member
// that held a partition past its session (a rebalance while it works)
// goes on with its records, a zombie, and its commits are refused. Under
// world.mu; no clock, no goroutine.
type topic struct {
	parts []*partition
}

type partition struct {
	recs      []string
	committed int
	owner     *proc
	gen       int
	dead      map[int]bool // offsets dead-lettered
}

// kstate is a member's fetch position in a partition it owns.
type kstate struct {
	gen    int
	pos    int
	paused time.Time
}

// krec is one record handed to a member.
type krec struct {
	part, off, gen int
	id             string
}

func newTopic(n int) *topic {
	t := &topic{}
	for range n {
		t.parts = append(t.parts, &partition{dead: map[int]bool{}})
	}
	return t
}

// publish appends id to the next partition, round robin.
func (t *topic) publish(id string) {
	n := 0
	for _, p := range t.parts {
		n += len(p.recs)
	}
	p := t.parts[n%len(t.parts)]
	p.recs = append(p.recs, id)
}

func (t *topic) owns(p *proc, i int) *kstate {
	part := t.parts[i]
	ks := p.kparts[i]
	if part.owner != p || ks == nil || ks.gen != part.gen {
		return nil
	}
	return ks
}

// ready reports whether a poll of p's would bring a record now.
func (t *topic) ready(p *proc, now time.Time) bool {
	for i, part := range t.parts {
		if ks := t.owns(p, i); ks != nil && !ks.paused.After(now) && ks.pos < len(part.recs) {
			return true
		}
	}
	return false
}

// poll hands p up to n records of the partitions it owns, in order.
func (t *topic) poll(p *proc, n int, now time.Time) []krec {
	var out []krec
	for i, part := range t.parts {
		ks := t.owns(p, i)
		if ks == nil || ks.paused.After(now) {
			continue
		}
		for ks.pos < len(part.recs) && len(out) < n {
			out = append(out, krec{part: i, off: ks.pos, gen: ks.gen, id: part.recs[ks.pos]})
			ks.pos++
		}
	}
	return out
}

func (t *topic) settled() bool {
	for _, p := range t.parts {
		if p.committed < len(p.recs) {
			return false
		}
	}
	return true
}

func (t *topic) nextDue(now time.Time) (time.Time, bool) {
	var next time.Time
	for i, part := range t.parts {
		if part.owner == nil {
			continue
		}
		if ks := t.owns(part.owner, i); ks != nil && ks.paused.After(now) && (next.IsZero() || ks.paused.Before(next)) {
			next = ks.paused
		}
	}
	return next, !next.IsZero()
}

// member reports whether p is a live member of the group.
func member(p *proc) bool { return p != nil && !p.isDead() && !p.exited && p.ctx.Err() == nil }

// assign gives every partition without a live owner to a live member
// (by its index, among the members in slot order): a new generation,
// from the committed offset. w.mu is held.
func (w *world) assign() {
	var ms []*proc
	for _, p := range w.slots {
		if member(p) {
			ms = append(ms, p)
		}
	}
	for i, part := range w.t.parts {
		if member(part.owner) || (part.owner != nil && !part.owner.isDead() && !part.owner.exited) {
			continue // owned, or its owner is shutting down: it leaves the group when its Run returns
		}
		if len(ms) == 0 {
			part.owner = nil
			continue
		}
		w.give(i, ms[i%len(ms)], "assigned")
	}
}

// give moves partition i to p: a new generation. w.mu is held.
func (w *world) give(i int, p *proc, why string) {
	part := w.t.parts[i]
	old := "nobody"
	if part.owner != nil {
		old = part.owner.name
	}
	part.gen++
	part.owner = p
	p.kparts[i] = &kstate{gen: part.gen, pos: part.committed}
	w.logf("partition %d %s to %s (from %s), generation %d, from offset %d", i, why, p.name, old, part.gen, part.committed)
}

// rebalance moves a partition to a member (maybe its own owner, which
// then starts again from the committed offset) while its owner may still
// be working on its records.
func (w *world) rebalance() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ms []*proc
	for _, p := range w.slots {
		if member(p) {
			ms = append(ms, p)
		}
	}
	if len(ms) == 0 {
		return false
	}
	w.give(w.rng.IntN(len(w.t.parts)), ms[w.rng.IntN(len(ms))], "rebalanced")
	w.stat("rebalance")
	return true
}

// kafkaLoop is the main goroutine of a Kafka member, as contrib/kafka's
// Run: poll, run each record through the Runner in order per partition
// (a record to requeue is sought back, its partition paused for the
// delay, and what follows it in the poll left to be fetched again; a
// dead-lettered record goes to the dead-letter topic, and its offset is
// committed at once), then commit the offsets of what was settled.
func (p *proc) kafkaLoop() {
	w := p.w
	next := map[int]int{}   // per partition, the offset after the last settled (the adapter's st.next)
	window := map[int]int{} // per partition, where the records that may be redeliveries start
	for !p.isDead() && p.ctx.Err() == nil {
		if err := w.turn(p.ctx, p, nil, "fetch"); err != nil {
			continue
		}
		w.mu.Lock()
		recs := w.t.poll(p, w.cfg.Prefetch, w.now())
		w.mu.Unlock()
		for _, r := range recs {
			w.logf("%s polls %s (partition %d, offset %d)", p.name, r.id, r.part, r.off)
		}
		stopped := map[int]bool{}
		last := map[int]krec{}
		for _, rec := range recs {
			if p.isDead() {
				return
			}
			if stopped[rec.part] {
				continue // sought back: fetched again
			}
			// The adapter's heuristic: a record within a poll's length of
			// where the partition was assigned or sought may have been
			// delivered before.
			if n, ok := next[rec.part]; !ok || n != rec.off {
				window[rec.part] = rec.off
			}
			maybe := rec.off < window[rec.part]+w.cfg.Prefetch
			switch p.kdeliver(rec, maybe) {
			case inbox.VerbAck:
				last[rec.part] = rec
				next[rec.part] = rec.off + 1
			case inbox.VerbDeadLetter:
				// contrib/kafka's commitDead: the dead letter's offset
				// is committed before the partition goes on (its ledger
				// record is forgotten: delivered again, it would start
				// afresh).
				last[rec.part] = rec
				next[rec.part] = rec.off + 1
				p.kcommit(map[int]krec{rec.part: rec})
			default:
				// Sought back: the record starts a window of records that
				// may have been delivered before (contrib/kafka's seek), so
				// that its next run reads its count first (seed 870).
				stopped[rec.part] = true
				delete(next, rec.part)
			}
		}
		if len(last) > 0 {
			p.kcommit(last)
		}
	}
}

// kdeliver runs one record through the Runner and maps its decision.
func (p *proc) kdeliver(rec krec, maybe bool) inbox.Verb {
	w := p.w
	r := p.newRun(rec.id)
	m := &inbox.Message{ID: rec.id, Source: "topic/" + strconv.Itoa(rec.part)}
	arrival := inbox.Arrival{HasID: true, Stopping: p.ctx.Err() != nil, MaybeRedelivered: maybe}
	ctx := context.WithValue(p.ctx, runKey, r)
	dec, core := p.runner.Deliver(ctx, m, inbox.Key{ID: rec.id}, arrival, inbox.Hooks{})
	w.checkCore(p, r, dec, core)
	if dec.Verb == inbox.VerbAck {
		return dec.Verb
	}
	if err := w.turn(context.Background(), p, r, "settle"); err != nil {
		return inbox.VerbNone
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	part := w.t.parts[rec.part]
	if dec.Verb == inbox.VerbDeadLetter {
		w.checkBudget(r, dec)
		var err error
		switch w.dlFault() {
		case dlBefore:
			err = errDLFailed
			w.logf("%s dead-letters %s (partition %d, offset %d): the produce failed", p.name, rec.id, rec.part, rec.off)
		case dlLost:
			err = errDLFailed
			part.dead[rec.off] = true
			w.dead[rec.id]++
			w.logf("%s dead-letters %s (partition %d, offset %d; %d failed runs: %v): produced, its answer lost", p.name, rec.id, rec.part, rec.off, dec.Failures, dec.Err)
		default:
			part.dead[rec.off] = true
			w.dead[rec.id]++
			w.dlOK[rec.id] = true
			w.logf("%s dead-letters %s (partition %d, offset %d; %d failed runs: %v)", p.name, rec.id, rec.part, rec.off, dec.Failures, dec.Err)
		}
		w.mu.Unlock()
		// Done: the core forgets its record (contrib/kafka's settleDead).
		// Failed: its record kept, the record sought back and its
		// partition paused for the core's delay; it comes back exhausted
		// and is dead-lettered on arrival, unrun.
		after := p.runner.DeadLettered(ctx, core, inbox.Key{ID: rec.id}, err)
		w.checkCore(p, r, after, core)
		w.mu.Lock()
		if err == nil {
			return dec.Verb
		}
		if ks := w.t.owns(p, rec.part); ks != nil && ks.gen == rec.gen {
			ks.pos = rec.off
			if after.Delay > 0 && p.ctx.Err() == nil {
				ks.paused = w.now().Add(after.Delay)
			}
		}
		w.logf("%s seeks %s back (partition %d, offset %d) after its failed dead letter, paused %v", p.name, rec.id, rec.part, rec.off, after.Delay)
		return inbox.VerbNone
	}
	// Requeue (or no decision): seek back to the record; after a
	// delay, its partition paused.
	if ks := w.t.owns(p, rec.part); ks != nil && ks.gen == rec.gen {
		ks.pos = rec.off
		if dec.Delay > 0 && p.ctx.Err() == nil {
			ks.paused = w.now().Add(dec.Delay)
		}
	}
	w.logf("%s seeks %s back (partition %d, offset %d), paused %v (%s, %d failed runs)", p.name, rec.id, rec.part, rec.off, dec.Delay, core.State(), dec.Failures)
	return dec.Verb
}

// kcommit commits the offsets after last, a turn of its own; refused for
// a partition p no longer owns in the record's generation.
func (p *proc) kcommit(last map[int]krec) {
	w := p.w
	if err := w.turn(context.Background(), p, nil, "commit"); err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	parts := make([]int, 0, len(last))
	for i := range last {
		parts = append(parts, i)
	}
	sort.Ints(parts)
	for _, i := range parts {
		rec := last[i]
		part := w.t.parts[i]
		if part.owner != p || part.gen != rec.gen {
			w.logf("%s commits partition %d at offset %d: refused (generation %d, now %d)", p.name, i, rec.off+1, rec.gen, part.gen)
			w.stat("commit refused (rebalanced)")
			continue
		}
		for off := part.committed; off <= rec.off; off++ {
			id := part.recs[off]
			if !part.dead[off] && w.db.effects[id] == 0 {
				w.failLocked(invAcked, id, "%s committed partition %d past offset %d (%s), whose effect has not committed", p.name, i, off, id)
			}
		}
		if rec.off+1 > part.committed {
			part.committed = rec.off + 1
		}
		w.logf("%s commits partition %d at offset %d", p.name, i, part.committed)
	}
}
