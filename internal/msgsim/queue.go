//go:build go1.26

package msgsim

import (
	"sort"
	"time"
)

// queue is the modelled at-least-once queue (RabbitMQ, NATS JetStream,
// SQS): it delivers each message to one consumer at a time, holds it
// until it is acked, requeued (at once or after a delay), dead-lettered,
// or returned (a crash of its holder, the end of its ack wait); it counts
// every delivery, requeues included, as quorum queues, JetStream and SQS
// do, and sets a redelivered flag as classic queues do. It has no clock
// and no goroutine: the world calls it in turns, under world.mu.
type queue struct {
	msgs   []*qmsg // in publishing order
	flight map[int]*qmsg
	tag    int
	dead   []string // dead-lettered ids, in order
}

type qmsg struct {
	seq        int
	id         string
	count      int // deliveries so far
	due        time.Time
	holder     *proc
	tag        int // the live delivery's tag; 0 when none
	done       bool
	deadLetter bool
	parked     bool      // held by its holder, unacknowledged, until due (Config.Hold), outside the holder's prefetch
	ackBy      time.Time // its live delivery's ack wait ends then (Config.AckWait); zero for none
}

// qdel is one delivery of a queue's message.
type qdel struct {
	tag         int
	id          string
	count       int  // the broker's count, this delivery included
	redelivered bool // delivered before
}

func newQueue() *queue { return &queue{flight: map[int]*qmsg{}} }

func (q *queue) publish(id string, now time.Time) {
	q.msgs = append(q.msgs, &qmsg{seq: len(q.msgs) + 1, id: id, due: now})
}

// held is how many of p's deliveries take a prefetch slot: a delivery
// held for its delay (parked) takes none, as contrib/rabbitmq's hold
// moves to a new subscription for it.
func (q *queue) held(p *proc) int {
	n := 0
	for _, m := range q.flight {
		if m.holder == p && !m.parked {
			n++
		}
	}
	return n
}

// ready reports whether p may take a delivery now.
func (q *queue) ready(p *proc, prefetch int, now time.Time) bool {
	if q.held(p) >= prefetch {
		return false
	}
	for _, m := range q.msgs {
		if !m.done && m.holder == nil && !m.due.After(now) {
			return true
		}
	}
	return false
}

// take hands p up to n messages that are ready and due, in order.
func (q *queue) take(p *proc, n int, now time.Time) []qdel {
	var out []qdel
	for _, m := range q.msgs {
		if len(out) >= n {
			break
		}
		if m.done || m.holder != nil || m.due.After(now) {
			continue
		}
		m.count++
		m.holder = p
		q.tag++
		m.tag = q.tag
		q.flight[q.tag] = m
		out = append(out, qdel{tag: q.tag, id: m.id, count: m.count, redelivered: m.count > 1})
	}
	return out
}

// settle takes the delivery tag out of flight; false when it is stale
// (settled already, returned by a crash or by the end of its ack wait).
func (q *queue) settle(tag int) (*qmsg, bool) {
	m, ok := q.flight[tag]
	if !ok {
		return nil, false
	}
	delete(q.flight, tag)
	m.holder = nil
	m.tag = 0
	m.parked = false
	m.ackBy = time.Time{}
	return m, true
}

// park keeps the delivery tag in flight with its holder until due, out of
// its prefetch: contrib/rabbitmq's hold. False when the tag is stale.
func (q *queue) park(tag int, due time.Time) (*qmsg, bool) {
	m, ok := q.flight[tag]
	if !ok {
		return nil, false
	}
	m.parked = true
	m.due = due
	return m, true
}

// dueParked reports whether p holds a parked delivery due now.
func (q *queue) dueParked(p *proc, now time.Time) bool {
	for _, m := range q.flight {
		if m.holder == p && m.parked && !m.due.After(now) {
			return true
		}
	}
	return false
}

func (q *queue) ack(tag int) (*qmsg, bool) {
	m, ok := q.settle(tag)
	if ok {
		m.done = true
	}
	return m, ok
}

func (q *queue) requeue(tag int, due time.Time) (*qmsg, bool) {
	m, ok := q.settle(tag)
	if ok {
		m.due = due
	}
	return m, ok
}

func (q *queue) deadLetter(tag int) (*qmsg, bool) {
	m, ok := q.settle(tag)
	if ok {
		m.done = true
		m.deadLetter = true
		q.dead = append(q.dead, m.id)
	}
	return m, ok
}

// crash returns every delivery p holds, ready now, as a broker does when
// a consumer's connection dies.
func (q *queue) crash(p *proc, now time.Time) int {
	tags := q.tagsOf(p)
	for _, t := range tags {
		m, _ := q.settle(t)
		m.due = now
	}
	return len(tags)
}

func (q *queue) tagsOf(p *proc) []int {
	var tags []int
	for t, m := range q.flight {
		if p == nil || m.holder == p {
			tags = append(tags, t)
		}
	}
	sort.Ints(tags)
	return tags
}

// expire ends the ack wait of the delivery tag: the message is ready for
// anyone now, while its holder may still be running it; the holder's
// tag is stale from now on.
func (q *queue) expire(tag int, now time.Time) *qmsg {
	m, ok := q.settle(tag)
	if ok {
		m.due = now
	}
	return m
}

// settled reports whether every message is acked or dead-lettered.
func (q *queue) settled() bool {
	for _, m := range q.msgs {
		if !m.done {
			return false
		}
	}
	return true
}

// nextDue is when the next message waiting out a delay is due.
func (q *queue) nextDue(now time.Time) (time.Time, bool) {
	var next time.Time
	for _, m := range q.msgs {
		if !m.done && (m.holder == nil || m.parked) && m.due.After(now) && (next.IsZero() || m.due.Before(next)) {
			next = m.due
		}
	}
	return next, !next.IsZero()
}
