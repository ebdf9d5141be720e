package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
)

func TestOutboxCommitsWithTheBusinessWrite(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	out := postgres.NewOutbox(f.pool)

	// Rolled back: neither the write nor the message.
	boom := errors.New("boom")
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		require.NoError(t, effectTx("orders", "o-1")(ctx, tx))
		_, err := out.Add(ctx, tx, postgres.OutboxMessage{Topic: "orders", Body: []byte("o-1")})
		require.NoError(t, err)
		return boom
	})
	require.ErrorIs(t, err, boom)

	var ids []string
	err = pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		require.NoError(t, effectTx("orders", "o-2")(ctx, tx))
		id, err := out.Add(ctx, tx, postgres.OutboxMessage{Topic: "orders", Key: []byte("k"), Body: []byte("o-2"), Header: map[string][]string{"a": {"b"}}})
		ids = append(ids, id)
		if err != nil {
			return err
		}
		id, err = out.Add(ctx, tx, postgres.OutboxMessage{ID: "mine", Topic: "orders", Body: []byte("o-3")})
		ids = append(ids, id)
		return err
	})
	require.NoError(t, err)
	assert.Len(t, ids[0], 36, "a minted key")
	assert.Equal(t, "mine", ids[1])

	var sent []postgres.OutboxMessage
	n, err := out.Relay(ctx, 10, func(_ context.Context, ms []postgres.OutboxMessage) error {
		sent = append(sent, ms...)
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	require.Len(t, sent, 2)
	assert.Equal(t, ids, []string{sent[0].ID, sent[1].ID}, "in order of Add")
	assert.Equal(t, []byte("k"), sent[0].Key)
	assert.Equal(t, map[string][]string{"a": {"b"}}, sent[0].Header)
	assert.False(t, sent[0].Created.IsZero())

	n, err = out.Relay(ctx, 10, func(context.Context, []postgres.OutboxMessage) error {
		t.Error("nothing left to send")
		return nil
	})
	require.NoError(t, err)
	assert.Zero(t, n)

	_, err = out.Add(ctx, nil, postgres.OutboxMessage{})
	assert.Error(t, err, "no topic")
	_, err = out.Relay(ctx, 0, nil)
	assert.Error(t, err)
}

// TestOutboxRelayCrashDedupedByInbox publishes through a relay that dies
// after the broker acknowledged and before the outbox rows were deleted:
// the next relay publishes the same messages again under the same ids,
// and the consumer's inbox runs each effect once. The dedup rests on the
// resend carrying the first send's ids, which the test checks too.
func TestOutboxRelayCrashDedupedByInbox(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	out := postgres.NewOutbox(f.pool)
	for i := range 5 {
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			_, err := out.Add(ctx, tx, postgres.OutboxMessage{Topic: "orders", Body: fmt.Appendf(nil, "order-%d", i)})
			return err
		})
		require.NoError(t, err)
	}
	var broker []postgres.OutboxMessage // what the broker holds, redeliveries included
	assert.Panics(t, func() {
		_, _ = out.Relay(ctx, 10, func(_ context.Context, ms []postgres.OutboxMessage) error {
			broker = append(broker, ms...)
			panic("relay killed after the broker acknowledged")
		})
	})
	n, err := out.Relay(ctx, 10, func(_ context.Context, ms []postgres.OutboxMessage) error {
		broker = append(broker, ms...)
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	require.Len(t, broker, 10, "every message published twice")
	for i := range 5 {
		assert.Equal(t, broker[i].ID, broker[i+5].ID, "the resend keeps the id")
	}

	for _, m := range broker {
		_, err := f.in.Process(ctx, "ledger", m.ID, effectTx("ledger", string(m.Body)))
		require.NoError(t, err)
	}
	assert.Equal(t, 5, f.count(t, "SELECT count(*) FROM d1_effects WHERE consumer = 'ledger'"), "each effect once")
}

// TestOutboxConcurrentRelays runs four relays at once over 200 messages:
// each message is published once (no crash, so no resend).
func TestOutboxConcurrentRelays(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	out := postgres.NewOutbox(f.pool)
	err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		for i := range 200 {
			if _, err := out.Add(ctx, tx, postgres.OutboxMessage{Topic: "t", Body: fmt.Appendf(nil, "%d", i)}); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	var mu sync.Mutex
	seen := make(map[string]int)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for {
				n, err := out.Relay(ctx, 7, func(_ context.Context, ms []postgres.OutboxMessage) error {
					mu.Lock()
					defer mu.Unlock()
					for _, m := range ms {
						seen[m.ID]++
					}
					return nil
				})
				if err != nil || n == 0 {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Len(t, seen, 200)
	for id, n := range seen {
		assert.Equal(t, 1, n, id)
	}
}

// ExampleOutbox writes an order and its "order created" message in one
// transaction, then relays the message with its stable id.
func ExampleOutbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db-primary/app")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	out := postgres.NewOutbox(pool)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", "o-42"); err != nil {
			return err
		}
		_, err := out.Add(ctx, tx, postgres.OutboxMessage{Topic: "orders", Key: []byte("o-42"), Body: []byte(`{"id":"o-42"}`)})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The relay loop, e.g. to Kafka with the id in the message-id header
	// that contrib/kafka's consumers read:
	_, err = out.Relay(ctx, 100, func(ctx context.Context, ms []postgres.OutboxMessage) error {
		for _, m := range ms {
			_ = m // producer.ProduceSync(ctx, &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Body, Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(m.ID)}}})
		}
		return nil
	})
	if err != nil {
		fmt.Println(err)
	}
}
