package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/inbox"
)

// run runs c until stop says to, then closes it and waits for Run.
func run(t testing.TB, c *kafka.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			c.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestHandlerErrorRedelivers checks that a record whose handler fails is
// delivered again, before any later record of its partition, and that its
// offset is not committed in the meantime.
func TestHandlerErrorRedelivers(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "a"}, {id: "b"}, {id: "c"}})

	seen := make(chan string, 10)
	failed := false
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: fastRetry,
		Handler: func(_ context.Context, m *inbox.Message) error {
			seen <- m.ID
			if m.ID == "b" && !failed {
				failed = true
				return errors.New("transient")
			}
			return nil
		},
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	stop := run(t, c)
	var got []string
	for len(got) < 4 {
		got = append(got, <-seen)
	}
	stop()
	assert.Equal(t, []string{"a", "b", "b", "c"}, got)
}

// TestNoMessageID checks the configurations for a record without the id
// header: by default Run stops with an error naming the record, before
// handling it or anything behind it in its partition; with DeadLetter, or
// DeadLetterTopic, it goes there, is reported, and the partition moves
// on. It is never handled, and never dropped silently. (With the report
// removed, the dead-lettered cases' hooks got nothing; with Run going on
// past the record, "c" was handled: this test failed both ways.)
func TestNoMessageID(t *testing.T) {
	seeds := newCluster(t, "t", 1, "t-dlq")
	produce(t, seeds, "t", []record{{id: "a"}, {body: "no id"}, {id: "c"}})

	t.Run("stop", func(t *testing.T) {
		seen := make(chan string, 10)
		c, err := kafka.NewConsumer(kafka.Config{
			Group: "stop", Topics: []string{"t"}, Retry: fastRetry,
			Handler: func(_ context.Context, m *inbox.Message) error { seen <- m.ID; return nil },
		}, groupOpts(seeds)...)
		require.NoError(t, err)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = c.Run(ctx)
		require.ErrorIs(t, err, inbox.ErrNoMessageID)
		assert.ErrorContains(t, err, "t/0 offset 1", "the error names the record")
		assert.Equal(t, "a", <-seen)
		assert.Empty(t, seen, "c waits behind the record without id")
	})

	t.Run("dead-letter handler", func(t *testing.T) {
		seen := make(chan string, 10)
		dead := make(chan string, 10)
		reported := make(chan inbox.DeadLetter, 10)
		c, err := kafka.NewConsumer(kafka.Config{
			Group: "dl", Topics: []string{"t"},
			Handler:      func(_ context.Context, m *inbox.Message) error { seen <- m.ID; return nil },
			DeadLetter:   func(_ context.Context, m *inbox.Message) error { dead <- string(m.Body); return nil },
			OnDeadLetter: func(d inbox.DeadLetter) { reported <- d },
		}, groupOpts(seeds)...)
		require.NoError(t, err)
		run(t, c)
		assert.Equal(t, "a", <-seen)
		assert.Equal(t, "no id", <-dead)
		assert.Equal(t, "c", <-seen)
		d := <-reported
		assert.ErrorIs(t, d.Err, inbox.ErrNoMessageID)
	})

	t.Run("dead-letter topic", func(t *testing.T) {
		seen := make(chan string, 10)
		reported := make(chan inbox.DeadLetter, 10)
		c, err := kafka.NewConsumer(kafka.Config{
			Group: "dlt", Topics: []string{"t"}, DeadLetterTopic: "t-dlq",
			Handler:      func(_ context.Context, m *inbox.Message) error { seen <- m.ID; return nil },
			OnDeadLetter: func(d inbox.DeadLetter) { reported <- d },
		}, groupOpts(seeds)...)
		require.NoError(t, err)
		run(t, c)
		assert.Equal(t, "a", <-seen)
		assert.Equal(t, "c", <-seen)
		d := <-reported
		assert.Contains(t, d.To, "t-dlq")
		got := consumeAll(t, seeds, "t-dlq", 1)
		assert.Equal(t, "no id", string(got[0].Value))
		assert.Equal(t, map[string]string{
			kafka.HeaderDeadLetterTopic: "t", kafka.HeaderDeadLetterPartition: "0", kafka.HeaderDeadLetterOffset: "1",
			kafka.HeaderDeadLetterError: inbox.ErrNoMessageID.Error(),
		}, headers(got[0]))
	})
}

// TestIDFromOffset checks the fallback id: topic/partition/offset.
func TestIDFromOffset(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{body: "x"}, {id: "mine"}})
	seen := make(chan string, 10)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, IDFromOffset: true,
		Handler: func(_ context.Context, m *inbox.Message) error { seen <- m.ID; return nil },
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	run(t, c)
	assert.Regexp(t, `^t@[0-9a-f]{32}/0/0$`, <-seen, "the topic, its ID, the partition, the offset")
	assert.Equal(t, "mine", <-seen, "the header wins")
}

// TestSQLOffsetsConcurrentOwners processes one record from 20 goroutines
// at once, as two members owning the same partition during a rebalance
// would: one effect. Later records run; earlier ones are duplicates.
func TestSQLOffsetsConcurrentOwners(t *testing.T) {
	db := newStore(t).mustOpen(t)
	ctx := context.Background()
	offs := &kafka.SQLOffsets{DB: db, Table: "d1_offsets"}
	require.NoError(t, offs.Migrate(ctx))
	_, err := db.Exec("CREATE TABLE d1_effects (id text NOT NULL)")
	require.NoError(t, err)
	effect := func(id string) func(ctx context.Context, tx *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO d1_effects (id) VALUES ($1)", id)
			return err
		}
	}
	rec := &kgo.Record{Topic: "t", Partition: 3, Offset: 7}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			_, err := offs.Process(ctx, "g", rec, effect("7"))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM d1_effects").Scan(&n))
	assert.Equal(t, 1, n)

	res, err := offs.Process(ctx, "g", &kgo.Record{Topic: "t", Partition: 3, Offset: 5}, effect("5"))
	require.NoError(t, err)
	assert.True(t, res.Duplicate, "behind the stored position")
	res, err = offs.Process(ctx, "g", &kgo.Record{Topic: "t", Partition: 3, Offset: 9}, effect("9"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate)
	pos, err := offs.Positions(ctx, "g", map[string][]int32{"t": {3}}, nil)
	require.NoError(t, err)
	assert.Equal(t, map[string]map[int32]int64{"t": {3: 10}}, pos)

	boom := errors.New("boom")
	_, err = offs.Process(ctx, "g", &kgo.Record{Topic: "t", Partition: 3, Offset: 10}, func(context.Context, *sql.Tx) error { return boom })
	assert.ErrorIs(t, err, boom)
	pos, err = offs.Positions(ctx, "g", map[string][]int32{"t": {3}}, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(10), pos["t"][3], "a failed effect does not advance the offset")

	require.NoError(t, db.Close())
	_, err = offs.Process(ctx, "g", &kgo.Record{Topic: "t", Partition: 3, Offset: 11}, effect("11"))
	assert.Error(t, err, "a closed database is an error, not a duplicate")
}

func TestConfigRequired(t *testing.T) {
	_, err := kafka.NewConsumer(kafka.Config{Group: "g"})
	assert.Error(t, err)
}
