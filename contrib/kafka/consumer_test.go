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
func run(t *testing.T, c *kafka.Consumer) (stop func()) {
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
		Group: "g", Topics: []string{"t"}, RetryDelay: time.Millisecond,
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

// TestNoMessageID checks the two configurations for a record without the
// id header: by default it is not processed, not committed, and holds its
// partition back, with ErrNoMessageID reported; with DeadLetter it goes
// there and the partition moves on.
func TestNoMessageID(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "a"}, {body: "no id"}, {id: "c"}})

	t.Run("held", func(t *testing.T) {
		seen := make(chan string, 10)
		errs := make(chan error, 100)
		c, err := kafka.NewConsumer(kafka.Config{
			Group: "held", Topics: []string{"t"}, RetryDelay: time.Millisecond,
			Handler: func(_ context.Context, m *inbox.Message) error { seen <- m.ID; return nil },
			OnError: func(err error) {
				select {
				case errs <- err:
				default:
				}
			},
		}, groupOpts(seeds)...)
		require.NoError(t, err)
		stop := run(t, c)
		assert.Equal(t, "a", <-seen)
		for range 3 { // retried, again and again
			assert.ErrorIs(t, <-errs, inbox.ErrNoMessageID)
		}
		stop()
		assert.Empty(t, seen, "c waits behind the record without id")
	})

	t.Run("dead-lettered", func(t *testing.T) {
		seen := make(chan string, 10)
		dead := make(chan string, 10)
		c, err := kafka.NewConsumer(kafka.Config{
			Group: "dl", Topics: []string{"t"},
			Handler:    func(_ context.Context, m *inbox.Message) error { seen <- m.ID; return nil },
			DeadLetter: func(_ context.Context, m *inbox.Message) error { dead <- string(m.Body); return nil },
		}, groupOpts(seeds)...)
		require.NoError(t, err)
		run(t, c)
		assert.Equal(t, "a", <-seen)
		assert.Equal(t, "no id", <-dead)
		assert.Equal(t, "c", <-seen)
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
	assert.Equal(t, "t/0/0", <-seen)
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
	pos, err := offs.Positions(ctx, "g", map[string][]int32{"t": {3}})
	require.NoError(t, err)
	assert.Equal(t, map[string]map[int32]int64{"t": {3: 10}}, pos)

	boom := errors.New("boom")
	_, err = offs.Process(ctx, "g", &kgo.Record{Topic: "t", Partition: 3, Offset: 10}, func(context.Context, *sql.Tx) error { return boom })
	assert.ErrorIs(t, err, boom)
	pos, err = offs.Positions(ctx, "g", map[string][]int32{"t": {3}})
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
