package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/inbox"
)

// Broker is a modelled at-least-once broker: a queue of messages that it
// delivers to consumers, each delivery held until it is acked, requeued
// (at once or after a delay), dead-lettered, or returned by a crash. It
// counts every delivery of a message, as quorum queues, JetStream and SQS
// do, whatever brought it back: a shutdown's requeue, a prefetch handed
// back, a crash. It has no goroutine and no clock of its own: time is the
// caller's ([Broker.Advance]), so the simulator drives it in virtual
// time, and a plain test with real time (see [ModelAdapter]).
//
// A Broker is safe for concurrent use.
type Broker struct {
	mu      sync.Mutex
	now     time.Duration
	seq     int
	msgs    []*brokerMsg // in publishing order
	flight  map[int]*brokerMsg
	dead    []string
	limit   int // a broker-side delivery limit; 0: none
	dropped []string
}

type brokerMsg struct {
	seq        int
	id         string // the producer's id; "" for none
	deliveries int    // the broker's count
	due        time.Duration
	holder     string // the consumer holding it; "" when ready
	done       bool
}

// BrokerDelivery is one delivery of a [Broker]'s message.
type BrokerDelivery struct {
	// Tag identifies the delivery, for its settling.
	Tag int
	// ID is the message's id ("" for none).
	ID string
	// Deliveries is the broker's count, this one included.
	Deliveries int
	// Consumer holds it.
	Consumer string
}

// Redelivered is what a broker says: delivered before.
func (d BrokerDelivery) Redelivered() bool { return d.Deliveries > 1 }

// NewBroker returns an empty broker. deliveryLimit, when positive, is a
// broker-side limit (a quorum queue's delivery-limit, JetStream's
// MaxDeliver): past it the broker drops the message, counting every
// delivery as it does.
func NewBroker(deliveryLimit int) *Broker {
	return &Broker{flight: make(map[int]*brokerMsg), limit: deliveryLimit}
}

// Publish adds a message with the producer's id (a second Publish of one
// id is a producer's retry: a second message).
func (b *Broker) Publish(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	b.msgs = append(b.msgs, &brokerMsg{seq: b.seq, id: id, due: b.now})
}

// Now returns the broker's time.
func (b *Broker) Now() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now
}

// Advance moves the broker's time by d.
func (b *Broker) Advance(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.now += d
}

// NextDue returns how long until the next requeued message is due, and
// false when none waits.
func (b *Broker) NextDue() (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var next time.Duration
	found := false
	for _, m := range b.msgs {
		if !m.done && m.holder == "" && m.due > b.now && (!found || m.due-b.now < next) {
			next, found = m.due-b.now, true
		}
	}
	return next, found
}

// Deliver hands consumer the next message that is ready and due, and
// false when there is none. max bounds what consumer may hold at once
// (its prefetch); zero means no bound.
func (b *Broker) Deliver(consumer string, max int) (BrokerDelivery, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if max > 0 {
		held := 0
		for _, m := range b.flight {
			if m.holder == consumer {
				held++
			}
		}
		if held >= max {
			return BrokerDelivery{}, false
		}
	}
	for _, m := range b.msgs {
		if m.done || m.holder != "" || m.due > b.now {
			continue
		}
		if b.limit > 0 && m.deliveries >= b.limit {
			m.done = true
			b.dropped = append(b.dropped, m.id)
			continue
		}
		m.deliveries++
		m.holder = consumer
		b.seq++
		b.flight[b.seq] = m
		return BrokerDelivery{Tag: b.seq, ID: m.id, Deliveries: m.deliveries, Consumer: consumer}, true
	}
	return BrokerDelivery{}, false
}

// ErrStaleTag: the delivery was settled already, or returned by a crash.
var ErrStaleTag = errors.New("inboxtest: stale delivery tag")

func (b *Broker) take(tag int) (*brokerMsg, error) {
	m, ok := b.flight[tag]
	if !ok {
		return nil, ErrStaleTag
	}
	delete(b.flight, tag)
	m.holder = ""
	return m, nil
}

// Ack settles the delivery tag as done.
func (b *Broker) Ack(tag int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, err := b.take(tag)
	if err == nil {
		m.done = true
	}
	return err
}

// Requeue hands the delivery tag back, due after delay.
func (b *Broker) Requeue(tag int, delay time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, err := b.take(tag)
	if err == nil {
		m.due = b.now + delay
	}
	return err
}

// DeadLetter moves the delivery tag's message to the dead-letter
// destination.
func (b *Broker) DeadLetter(tag int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, err := b.take(tag)
	if err == nil {
		m.done = true
		b.dead = append(b.dead, m.id)
	}
	return err
}

// Crash returns every delivery consumer holds, as a broker does when a
// consumer's connection dies: ready at once, each counted.
func (b *Broker) Crash(consumer string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for tag, m := range b.flight {
		if m.holder == consumer {
			delete(b.flight, tag)
			m.holder = ""
			m.due = b.now
		}
	}
}

// Duplicate makes a copy, ready now, of every message consumer holds,
// while consumer keeps its deliveries (a rebalance that moves a partition
// while its old owner still works, a visibility timeout that ends): two
// deliveries of one message at once, each settled on its own.
func (b *Broker) Duplicate(consumer string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	tags := make([]int, 0, len(b.flight))
	for tag, m := range b.flight {
		if m.holder == consumer {
			tags = append(tags, tag)
		}
	}
	sort.Ints(tags) // the same order every run
	for _, tag := range tags {
		// A copy with the same broker count, ready now.
		c := *b.flight[tag]
		c.holder = ""
		c.due = b.now
		b.seq++
		c.seq = b.seq
		b.msgs = append(b.msgs, &c)
	}
}

// DeadLettered returns the ids in the dead-letter destination, sorted.
func (b *Broker) DeadLettered() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := slices.Clone(b.dead)
	sort.Strings(out)
	return out
}

// Dropped returns the ids the broker's own delivery limit dropped.
func (b *Broker) Dropped() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.dropped)
}

// Settled reports whether every message is acked, dead-lettered or
// dropped, none in flight.
func (b *Broker) Settled() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.msgs {
		if !m.done {
			return false
		}
	}
	return len(b.flight) == 0
}

// Store is a modelled inbox database: the processed ids, the effects the
// handlers committed with them, and the ledger's records, with the
// semantics of the real ones: an id and its effect commit together or not
// at all, and two transactions of one id exclude each other (the second
// is told to wait, [ErrLocked], rather than blocking). Its [Store.Ledger]
// is an [inbox.Ledger] whose OpBegin, OpFail and OpFailBegun say a
// processed message is processed, as inbox.SQLLedger's do.
//
// A Store is safe for concurrent use; its zero value is not usable: use
// [NewStore].
type Store struct {
	mu        sync.Mutex
	processed map[string]bool // by stored consumer and id
	dead      map[string]bool // tombstones (inbox.OpTombstone), by stored consumer and id
	locked    map[string]*Tx
	effects   map[string]int // by message id
	ledger    map[inbox.Key]inbox.Record
	down      bool
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{processed: map[string]bool{}, dead: map[string]bool{}, locked: map[string]*Tx{}, effects: map[string]int{}, ledger: map[inbox.Key]inbox.Record{}}
}

// ErrLocked: another transaction holds the message's row; try again once
// it ends.
var ErrLocked = errors.New("inboxtest: the message's row is locked by another transaction")

// ErrDown: the modelled database is unreachable ([Store.SetDown]).
var ErrDown = errors.New("inboxtest: the database is unreachable")

// SetDown makes every later call fail with [ErrDown] (down) or work again.
func (s *Store) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

func rowKey(k inbox.Key) string { return k.IDSpace + "\x1f" + k.ID }

// Tx is a modelled inbox transaction of one message: [Store.Begin] it,
// then [Tx.Commit] (its effect and id together) or [Tx.Rollback].
type Tx struct {
	s    *Store
	k    inbox.Key
	done bool
}

// Begin starts the transaction of the message k: it inserts k's row. It
// returns dup true when k is processed (nothing to run), ErrLocked when
// another transaction holds k's row, and [inbox.ErrDeadLettered] when the
// row is k's tombstone.
func (s *Store) Begin(k inbox.Key) (tx *Tx, dup bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return nil, false, ErrDown
	}
	rk := rowKey(k)
	if s.processed[rk] {
		return nil, true, nil
	}
	if s.dead[rk] {
		return nil, false, inbox.ErrDeadLettered
	}
	if s.locked[rk] != nil {
		return nil, false, ErrLocked
	}
	tx = &Tx{s: s, k: k}
	s.locked[rk] = tx
	return tx, false, nil
}

// Commit commits the effect and the id together.
func (tx *Tx) Commit() error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.done {
		return errors.New("inboxtest: transaction ended")
	}
	tx.done = true
	delete(s.locked, rowKey(tx.k))
	if s.down {
		return ErrDown
	}
	s.processed[rowKey(tx.k)] = true
	s.effects[tx.k.ID]++
	return nil
}

// Rollback ends the transaction with nothing written (also what a crash,
// or a server-side timeout, does).
func (tx *Tx) Rollback() {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !tx.done {
		tx.done = true
		delete(s.locked, rowKey(tx.k))
	}
}

// Redrive clears the tombstone of k and its ledger record, as
// inbox.SQLLedger's Redrive does, and reports whether there was one.
func (s *Store) Redrive(_ context.Context, k inbox.Key) (bool, error) {
	if k.ID == "" {
		return false, inbox.ErrNoMessageID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return false, ErrDown
	}
	rk := rowKey(k)
	was := s.dead[rk]
	if was {
		delete(s.dead, rk)
		delete(s.ledger, k)
	}
	return was, nil
}

// Effects returns how many times the effect of the message id committed.
func (s *Store) Effects(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[id]
}

// Ledger returns the store's [inbox.Ledger].
func (s *Store) Ledger() inbox.Ledger { return storeLedger{s} }

type storeLedger struct{ s *Store }

// Apply implements [inbox.Ledger], with [inbox.MemoryLedger]'s counts and
// the store's processed ids, which OpBegin, OpFail and OpFailBegun answer.
func (l storeLedger) Apply(ctx context.Context, k inbox.Key, op inbox.Op) (inbox.Record, error) {
	s := l.s
	if err := ctx.Err(); err != nil {
		return inbox.Record{}, err
	}
	if k.ID == "" {
		return inbox.Record{}, inbox.ErrNoMessageID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return inbox.Record{}, ErrDown
	}
	r, ok := s.ledger[k]
	rk := rowKey(k)
	switch op {
	case inbox.OpBegin, inbox.OpFail, inbox.OpFailBegun:
		if s.processed[rk] {
			// Processed: nothing written, as inbox.SQLLedger.
			return inbox.Record{Processed: true}, nil
		}
		if s.dead[rk] {
			return inbox.Record{DeadLettered: true}, nil
		}
	case inbox.OpTombstone:
		// The row of the id, as the effect's: the first to commit wins.
		switch {
		case s.processed[rk]:
			return inbox.Record{Processed: true}, nil
		case s.locked[rk] != nil:
			return inbox.Record{}, ErrLocked
		}
		s.dead[rk] = true
		r.DeadLettered = true
		return r, nil
	}
	switch op {
	case inbox.OpBegin:
		before := r
		r.Running++
		s.ledger[k] = r
		return before, nil
	case inbox.OpFail:
		r.Failures++
	case inbox.OpFailBegun:
		r.Failures++
		r.Running = max(r.Running-1, 0)
	case inbox.OpExcuse:
		if !ok {
			return inbox.Record{}, nil
		}
		r.Running = max(r.Running-1, 0)
	case inbox.OpForget:
		delete(s.ledger, k)
		return inbox.Record{}, nil
	default:
		return inbox.Record{}, fmt.Errorf("inboxtest: unknown op %d", op)
	}
	s.ledger[k] = r
	return r, nil
}

// Handle returns the inbox handler of the store: fn runs in the message's
// transaction only when its id is new, and its effect commits with the
// id when fn returns nil; a duplicate returns nil. A locked row is
// waited for (polling every millisecond, until ctx ends), as a real
// database's insert waits.
func (s *Store) Handle(fn func(ctx context.Context, m *inbox.Message) error) inbox.Handler {
	return func(ctx context.Context, m *inbox.Message) error {
		if m.ID == "" {
			return inbox.ErrNoMessageID
		}
		k := inbox.Key{IDSpace: m.IDSpace, ID: m.ID}
		for {
			tx, dup, err := s.Begin(k)
			switch {
			case dup:
				return nil
			case errors.Is(err, ErrLocked):
				t := time.NewTimer(time.Millisecond)
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
				continue
			case err != nil:
				return err
			}
			if err := fn(ctx, m); err != nil {
				tx.Rollback()
				return err
			}
			if ctx.Err() != nil {
				// The transaction cannot outlive the context (as the real
				// inbox's does not, past its deadline).
				tx.Rollback()
				return ctx.Err()
			}
			return tx.Commit()
		}
	}
}
