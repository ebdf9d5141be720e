//go:build go1.26

package msgsim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
)

// Config is one world: its size, its broker, its consumers' settings and
// how often each fault strikes. A seed draws one ([ConfigFor]); shrinking
// a failure edits it and runs it again with the same seed. Probabilities
// are in percent of the messages (behaviours) or in weights among the
// driver's choices (faults), unless the field says otherwise.
type Config struct {
	Messages  int // messages published
	Dups      int // of them, how many the producer publishes twice (a producer's retry: a second broker message, one id)
	Consumers int // consumer processes sharing the queue (or the topic's partitions)
	Prefetch  int // deliveries a consumer takes ahead of its handler (a QoS prefetch, a pull's batch, a poll)
	Steps     int // the driver's steps while faults strike; then the recovery runs without faults

	Counting      bool // the broker counts every delivery, requeues included (quorum queues, JetStream, SQS), and says so in a header; else only a redelivered flag (classic queues)
	Kafka         bool // a topic of partitions with committed offsets instead of a queue
	Partitions    int  // the topic's partitions (Kafka)
	MaxDeliveries int  // Retry.MaxDeliveries: the failed runs a message gets before it is dead-lettered
	Limit         int  // the processing limit, in seconds
	// Hold: a queue's consumer holds a failed delivery, unacknowledged,
	// for its retry delay and then requeues it, as contrib/rabbitmq does
	// (RabbitMQ has no delayed requeue), outside its prefetch (the
	// adapter moves to a new subscription); else the broker keeps it for
	// the delay (JetStream's NakWithDelay, SQS's visibility). Queues only.
	Hold bool
	// Batch: the consumers take their deliveries in batches (every
	// delivery they hold, when two or more) through inbox.SQL's
	// ProcessBatch, one transaction for the batch, and ack them all once
	// it commits; a batch that fails (a handler's error, a tombstone's
	// ErrDeadLettered, a commit that failed) goes through the message
	// core one delivery at a time (inbox.Runner over Handle), which
	// counts failures and dead-letters. Queues only (a Kafka member
	// processes a partition's records in order, one at a time).
	Batch bool
	// LateDups: the producer's duplicates (Dups) are published at this
	// driver step (at the end of the faults if that comes first),
	// together, instead of right after their originals: a producer's
	// retry, or an outbox's relay after its crash, minutes later, when
	// the original may have been processed or dead-lettered. 0: with
	// their originals.
	LateDups int
	// Spaces: how many messages a second queue publishes (id space "b",
	// Message.IDSpace) with the id of one of the first queue's messages
	// (no id space): one inbox, colliding ids, and each must run. Queues
	// only.
	Spaces int
	// NoIDs: how many messages carry no id. The core's documented answer
	// (Policy.NoID's default) is a dead letter, reported, never run.
	// Queues only.
	NoIDs int

	// Redrive: the weight of an operator's redrive among the faults: a
	// dead letter taken from the dead-letter destination, its tombstone
	// cleared with SQLLedger.Redrive (retried until it succeeds), then
	// published again to the queue. Queues only.
	Redrive int
	// Prune: the weight of a run of inbox.SQL's Prune among the faults,
	// at the age the docs require: older than the broker's redelivery
	// horizon (the oldest row, in the inbox or the ledger, of a message
	// the broker may still deliver: a copy not settled, a producer's
	// duplicate not yet published, a dead letter the operator may
	// redrive), and up to a minute more. Queues only.
	Prune int
	// AckWait: the broker's ack wait, in seconds (JetStream's AckWait,
	// SQS's visibility timeout): a delivery not acked, and not renewed
	// for that long, is ready for anyone. The Runner beats every third of
	// it while a handler runs (Runner.Every: JetStream's AckProgress, an
	// SQS visibility extension), which renews it. 0: no ack wait (the
	// Expire fault alone ends one). Queues that hold no failed delivery
	// (Hold off: RabbitMQ has no ack wait).
	AckWait int

	// The handlers, in percent of the messages.
	Poison int // always fails
	Flaky  int // fails on its first two runs, then commits
	Killer int // kills its consumer's process, every time
	Hanger int // runs past the processing limit, ignoring its context, every time
	Slow   int // takes up to half the processing limit (a healthy handler otherwise takes up to a second)

	// Faults, weights among the driver's choices while faults strike.
	Shutdowns  int // a consumer shut down (its handler's context ends, what it holds goes back) and started again
	Crashes    int // consumers' processes killed (their in-memory state gone, their deliveries returned), at most this many
	Expire     int // a delivery's ack wait (visibility timeout) ends while its consumer still holds it: another consumer gets it (queues)
	Rebalance  int // a partition moved to another consumer while its owner still works on it (Kafka)
	DBDown     int // the database unreachable for a while
	CommitFail int // permille of the database's commits that fail: half before they apply, half after (outcome unknown)
	DLFail     int // percent of the dead letters that fail: half before they land (a reject on a channel that closed, a produce refused), half after (the answer lost)
}

// ConfigFor draws the world of seed: small (a failure is easier to read
// in a small world, and small worlds are fast), with each fault on in
// about half of the seeds and at a strength drawn anew (swarm testing).
func ConfigFor(seed uint64) Config {
	r := rand.New(rand.NewPCG(seed, 0x1db0c5))
	on := func(lo, hi int) int {
		if r.IntN(2) == 0 {
			return 0
		}
		return lo + r.IntN(hi-lo+1)
	}
	c := Config{
		Messages:      2 + r.IntN(9),
		Consumers:     1 + r.IntN(3),
		Prefetch:      1 + r.IntN(4),
		Steps:         20 + r.IntN(130),
		Counting:      r.IntN(2) == 0,
		Kafka:         r.IntN(3) == 0,
		MaxDeliveries: 2 + r.IntN(4),
		Limit:         5 + r.IntN(16),

		Poison: on(5, 30),
		Flaky:  on(5, 30),
		Killer: on(5, 20),
		Hanger: on(5, 20),
		Slow:   on(10, 60),

		Shutdowns:  on(1, 6),
		Crashes:    r.IntN(4),
		Expire:     on(1, 4),
		Rebalance:  on(1, 4),
		DBDown:     on(1, 3),
		CommitFail: on(5, 80),
	}
	c.Dups = r.IntN(c.Messages/2 + 1)
	if c.Kafka {
		c.Partitions = 1 + r.IntN(3)
	}
	// Drawn last, so that the fields above keep the values they had
	// before these were added.
	c.Hold = !c.Kafka && r.IntN(2) == 0
	c.DLFail = on(10, 50)
	c.Batch = !c.Kafka && r.IntN(2) == 0
	c.LateDups = on(10, 150)
	if !c.Kafka {
		c.Spaces = min(on(1, 4), c.Messages)
		c.NoIDs = on(1, 2)
		c.Redrive = on(2, 6)
		c.Prune = on(1, 4)
		if !c.Hold {
			c.AckWait = on(2, 8)
		}
	}
	return c
}

// String is the form ParseConfig reads: every field, name=value.
func (c Config) String() string {
	v := reflect.ValueOf(c)
	var b strings.Builder
	for i := range v.NumField() {
		if i > 0 {
			b.WriteByte(',')
		}
		f := v.Field(i)
		b.WriteString(strings.ToLower(v.Type().Field(i).Name))
		b.WriteByte('=')
		if f.Kind() == reflect.Bool {
			b.WriteString(strconv.FormatBool(f.Bool()))
		} else {
			b.WriteString(strconv.FormatInt(f.Int(), 10))
		}
	}
	return b.String()
}

// ParseConfig reads what String writes onto base: fields not named keep
// base's values.
func ParseConfig(base Config, s string) (Config, error) {
	v := reflect.ValueOf(&base).Elem()
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return base, fmt.Errorf("msgsim config: %q is not name=value", kv)
		}
		f := v.FieldByNameFunc(func(n string) bool { return strings.EqualFold(n, k) })
		if !f.IsValid() {
			return base, fmt.Errorf("msgsim config: no field %q", k)
		}
		if f.Kind() == reflect.Bool {
			b, err := strconv.ParseBool(val)
			if err != nil {
				return base, fmt.Errorf("msgsim config: %s: %w", k, err)
			}
			f.SetBool(b)
			continue
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return base, fmt.Errorf("msgsim config: %s: %w", k, err)
		}
		f.SetInt(n)
	}
	return base, nil
}

// smaller returns the worlds one step smaller than c, the biggest cuts
// first: fewer steps, messages, consumers, crashes; each fault and
// behaviour off in turn.
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
		d.Messages = max(d.Messages/2, 1)
		d.Dups, d.Spaces = min(d.Dups, d.Messages), min(d.Spaces, d.Messages)
	})
	edit(func(d *Config) {
		d.Messages = max(d.Messages-1, 1)
		d.Dups, d.Spaces = min(d.Dups, d.Messages), min(d.Spaces, d.Messages)
	})
	edit(func(d *Config) { d.Dups = max(d.Dups-1, 0) })
	edit(func(d *Config) { d.Consumers = max(d.Consumers-1, 1) })
	edit(func(d *Config) { d.Prefetch = max(d.Prefetch-1, 1) })
	edit(func(d *Config) { d.Partitions = max(d.Partitions-1, min(d.Partitions, 1)) })
	edit(func(d *Config) { d.Crashes = max(d.Crashes-1, 0) })
	for _, f := range []func(*Config){
		func(d *Config) { d.Poison = 0 }, func(d *Config) { d.Flaky = 0 }, func(d *Config) { d.Killer = 0 },
		func(d *Config) { d.Hanger = 0 }, func(d *Config) { d.Slow = 0 }, func(d *Config) { d.Shutdowns = 0 },
		func(d *Config) { d.Expire = 0 }, func(d *Config) { d.Rebalance = 0 }, func(d *Config) { d.DBDown = 0 },
		func(d *Config) { d.CommitFail = 0 }, func(d *Config) { d.Counting = false },
		func(d *Config) { d.Hold = false }, func(d *Config) { d.DLFail = 0 }, func(d *Config) { d.Batch = false }, func(d *Config) { d.LateDups = 0 },
		func(d *Config) { d.Spaces = 0 }, func(d *Config) { d.NoIDs = 0 }, func(d *Config) { d.Redrive = 0 },
		func(d *Config) { d.Prune = 0 }, func(d *Config) { d.AckWait = 0 },
	} {
		edit(f)
	}
	edit(func(d *Config) { d.Steps = d.Steps * 3 / 4 })
	return out
}
