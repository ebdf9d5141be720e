package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/inbox"
)

// A record whose handler always fails is delivered MaxDeliveries times,
// each later than the one before by at least the Retry's growing delay,
// then produced to the dead-letter topic (with where it came from and
// why), committed, reported once, and the partition goes on. (With the
// pause taken out, the gaps were a few milliseconds; with no limit, the
// dead-letter topic stayed empty: this test failed both ways.)
func TestPoisonDeadLetterTopic(t *testing.T) {
	seeds := newCluster(t, "t", 1, "t-dlq")
	produce(t, seeds, "t", []record{{id: "poison", body: "bad"}, {id: "ok-1"}})
	retry := inbox.Retry{Delay: 100 * time.Millisecond, MaxDelay: time.Second, MaxDeliveries: 3}
	var mu sync.Mutex
	var calls []time.Time
	seen := make(chan string, 10)
	reported := make(chan inbox.DeadLetter, 10)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: retry, DeadLetterTopic: "t-dlq",
		Handler: func(_ context.Context, m *inbox.Message) error {
			if m.ID == "poison" {
				mu.Lock()
				calls = append(calls, time.Now())
				mu.Unlock()
				return errors.New("cannot parse the order")
			}
			seen <- m.ID
			return nil
		},
		OnDeadLetter: func(d inbox.DeadLetter) { reported <- d },
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	stop := run(t, c)
	assert.Equal(t, "ok-1", recv(t, seen), "the partition goes on after the dead letter")
	stop()

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 3)
	for i := 1; i < len(calls); i++ {
		assert.GreaterOrEqual(t, calls[i].Sub(calls[i-1]), retry.After(i), "redelivery %d waited its delay", i)
	}
	require.Len(t, reported, 1, "reported once")
	d := <-reported
	assert.Equal(t, 3, d.Deliveries)
	assert.Equal(t, "topic t-dlq", d.To)
	got := consumeAll(t, seeds, "t-dlq", 1)
	assert.Equal(t, "bad", string(got[0].Value))
	assert.Equal(t, "cannot parse the order", headers(got[0])[kafka.HeaderDeadLetterError])

	// Committed: the group does not see it again.
	again := make(chan string, 10)
	c2, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"},
		Handler: func(_ context.Context, m *inbox.Message) error { again <- m.ID; return nil },
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	run(t, c2)
	produce(t, seeds, "t", []record{{id: "ok-2"}})
	assert.Equal(t, "ok-2", recv(t, again))
}

// Without a dead-letter destination, a poison record holds its partition,
// and every failure past MaxDeliveries is reported: the block is never
// silent. (Without the report, nothing was: this test failed.)
func TestPoisonWithoutDestinationHolds(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "poison"}, {id: "ok-1"}})
	seen := make(chan string, 10)
	reported := make(chan inbox.DeadLetter, 10)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: inbox.Retry{Delay: time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxDeliveries: 2},
		Handler: func(_ context.Context, m *inbox.Message) error {
			if m.ID == "poison" {
				return errors.New("cannot parse")
			}
			seen <- m.ID
			return nil
		},
		OnDeadLetter: func(d inbox.DeadLetter) {
			select {
			case reported <- d:
			default:
			}
		},
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	stop := run(t, c)
	for want := 2; want <= 4; want++ {
		d := recv(t, reported)
		assert.Equal(t, want, d.Deliveries)
		assert.Contains(t, d.To, "holds its partition")
	}
	stop()
	assert.Empty(t, seen, "nothing behind it ran")
}

// One failing partition does not hold up the others: a partition whose
// record fails pauses alone, and records produced to another partition
// meanwhile are handled at once. (With the consumer sleeping the whole
// retry delay, an hour here, partition 1's records never came: this test
// failed. BenchmarkPartitionIsolation measures the latency.)
func TestOnePartitionFailing(t *testing.T) {
	seeds := newCluster(t, "t", 2)
	produce(t, seeds, "t", []record{{id: "poison", partition: 0}})
	failed := make(chan struct{}, 10)
	seen := make(chan string, 10)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: inbox.Retry{Delay: time.Hour, MaxDeliveries: -1},
		Handler: func(_ context.Context, m *inbox.Message) error {
			if m.ID == "poison" {
				failed <- struct{}{}
				return errors.New("cannot parse")
			}
			seen <- m.ID
			return nil
		},
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	run(t, c)
	<-failed
	for i, id := range []string{"ok-1", "ok-2", "ok-3"} {
		produce(t, seeds, "t", []record{{id: id, partition: 1}})
		select {
		case got := <-seen:
			assert.Equal(t, id, got)
		case <-time.After(20 * time.Second):
			t.Fatalf("record %d of the healthy partition not handled while the other waits", i)
		}
	}
	assert.Len(t, failed, 0, "the failing partition waits its hour")
}

// Cancelling Run while a handler runs leaves its record uncommitted, to be
// delivered again, and never dead-letters it, even with MaxDeliveries 1.
// (With Run counting the shutdown's error as a failure, the record went
// to DeadLetter and the next consumer never saw it: this test failed.)
func TestShutdownNotCommitted(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "order-1"}})
	var dead atomic.Int32
	// One ledger for every member, as the inbox's in the database is.
	ledger := &inbox.MemoryLedger{}
	for range 3 { // three shutdowns while the handler runs: none counts
		started := make(chan struct{})
		c, err := kafka.NewConsumer(kafka.Config{
			Group: "g", Topics: []string{"t"}, Retry: inbox.Retry{MaxDeliveries: 1}, Ledger: ledger,
			Handler: func(ctx context.Context, _ *inbox.Message) error {
				close(started)
				<-ctx.Done()
				return ctx.Err()
			},
			// Never fails, even with its context done: only Run's choice
			// can keep a record from it.
			DeadLetter: func(context.Context, *inbox.Message) error { dead.Add(1); return nil },
		}, groupOpts(seeds)...)
		require.NoError(t, err)
		stop := run(t, c)
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the record was not delivered again")
		}
		stop()
	}
	assert.Zero(t, dead.Load())

	again := make(chan string, 1)
	c2, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"},
		Handler: func(_ context.Context, m *inbox.Message) error { again <- m.ID; return nil },
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	run(t, c2)
	select {
	case id := <-again:
		assert.Equal(t, "order-1", id)
	case <-time.After(30 * time.Second):
		t.Fatal("the record was not delivered again")
	}
}

// A handler that runs past the processing limit has its context ended;
// the record counts as failed and is delivered again. (Without the limit,
// the first call never returned: this test failed.)
func TestProcessingLimit(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "slow"}})
	var calls atomic.Int32
	errs := make(chan error, 10)
	done := make(chan struct{})
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: fastRetry, ProcessingLimit: 100 * time.Millisecond,
		Handler: func(ctx context.Context, _ *inbox.Message) error {
			if calls.Add(1) == 1 {
				<-ctx.Done() // hangs until its limit
				return ctx.Err()
			}
			close(done)
			return nil
		},
		OnError: func(err error) { errs <- err },
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	run(t, c)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("not delivered again after the limit")
	}
	err = <-errs
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "processing limit")
}

// Each record's IDSpace is its topic, or the declared one.
func TestIDSpace(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "a"}})
	for _, tt := range []struct{ give, want string }{{"", "t"}, {"orders", "orders"}} {
		got := make(chan string, 1)
		c, err := kafka.NewConsumer(kafka.Config{
			Group: "g-" + tt.want, Topics: []string{"t"}, IDSpace: tt.give,
			Handler: func(_ context.Context, m *inbox.Message) error { got <- m.IDSpace; return nil },
		}, groupOpts(seeds)...)
		require.NoError(t, err)
		stop := run(t, c)
		assert.Equal(t, tt.want, recv(t, got))
		stop()
	}
}

// The consumer reads committed records only: a transactional producer's
// aborted record has no effect, in both modes (the inbox, and offsets in
// the database), and its committed one has. (With franz-go's default,
// read-uncommitted, the aborted record's effect ran in both modes: this
// test failed.)
func TestReadCommittedOnly(t *testing.T) {
	for _, mode := range []string{"inbox", "offsets"} {
		t.Run(mode, func(t *testing.T) {
			seeds := newCluster(t, "t", 1)
			db := newStore(t).mustOpen(t)
			ctx := context.Background()
			_, err := db.Exec("CREATE TABLE d1_effects (id text NOT NULL)")
			require.NoError(t, err)
			write := func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO d1_effects (id) VALUES ($1)", m.Header["message-id"][0])
				return err
			}
			cfg := kafka.Config{Group: "g", Topics: []string{"t"}}
			var h inbox.Handler
			if mode == "inbox" {
				in := &inbox.SQL{DB: db}
				require.NoError(t, in.Migrate(ctx))
				h = in.Handle("g", write)
			} else {
				offs := &kafka.SQLOffsets{DB: db}
				require.NoError(t, offs.Migrate(ctx))
				h = offs.Handle("g", write)
				cfg.Positions = offs
			}
			seen := make(chan string, 10)
			cfg.Handler = func(ctx context.Context, m *inbox.Message) error {
				err := h(ctx, m)
				if err == nil {
					seen <- m.ID
				}
				return err
			}

			produceTx(t, seeds, "t", "aborted", false)
			produceTx(t, seeds, "t", "committed", true)
			produce(t, seeds, "t", []record{{id: "plain"}})

			c, err := kafka.NewConsumer(cfg, groupOpts(seeds)...)
			require.NoError(t, err)
			stop := run(t, c)
			var got []string
			for len(got) < 2 {
				got = append(got, recv(t, seen))
			}
			stop()
			assert.Equal(t, []string{"committed", "plain"}, got)
			var ids []string
			rows, err := db.Query("SELECT id FROM d1_effects ORDER BY id")
			require.NoError(t, err)
			for rows.Next() {
				var id string
				require.NoError(t, rows.Scan(&id))
				ids = append(ids, id)
			}
			require.NoError(t, rows.Err())
			assert.Equal(t, []string{"committed", "plain"}, ids, "no effect of the aborted record")
		})
	}
}

// produceTx produces one record with id in a transaction of its own, and
// commits or aborts it.
func produceTx(t *testing.T, seeds, topic, id string, commit bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.DefaultProduceTopic(topic), kgo.TransactionalID("tx-"+id))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.BeginTransaction())
	r := &kgo.Record{Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}
	require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
	end := kgo.TryAbort
	if commit {
		end = kgo.TryCommit
	}
	require.NoError(t, cl.EndTransaction(ctx, end))
}

// SQLOffsets survives a topic deleted and created again: the new
// incarnation's offsets start over at 0, below the stored position of the
// old one, and its records run; the stored row then belongs to the new
// topic. Offset-derived ids carry the topic's ID too. (With the stored
// position kept across incarnations, the new topic's first records were
// skipped as duplicates, with no effect and no error: this test failed.)
func TestSQLOffsetsTopicRecreated(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	db := newStore(t).mustOpen(t)
	ctx := context.Background()
	offs := &kafka.SQLOffsets{DB: db}
	require.NoError(t, offs.Migrate(ctx))
	_, err := db.Exec("CREATE TABLE d1_effects (id text NOT NULL)")
	require.NoError(t, err)
	consume := func(want int) []string {
		t.Helper()
		seen := make(chan string, 20)
		effect := offs.Handle("g", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO d1_effects (id) VALUES ($1)", m.Header["message-id"][0])
			return err
		})
		h := func(ctx context.Context, m *inbox.Message) error {
			err := effect(ctx, m)
			if err == nil { // committed
				seen <- m.Header["message-id"][0] + " " + kafka.OffsetID(m.Raw.(*kgo.Record))
			}
			return err
		}
		c, err := kafka.NewConsumer(kafka.Config{Group: "g", Topics: []string{"t"}, Handler: h, Positions: offs}, groupOpts(seeds)...)
		require.NoError(t, err)
		stop := run(t, c)
		defer stop()
		var got []string
		for len(got) < want {
			select {
			case s := <-seen:
				got = append(got, s)
			case <-time.After(30 * time.Second):
				t.Fatalf("%d of %d records: %v", len(got), want, got)
			}
		}
		return got
	}
	produce(t, seeds, "t", []record{{id: "old-0"}, {id: "old-1"}, {id: "old-2"}})
	old := consume(3)

	recreateTopic(t, seeds, "t")
	produce(t, seeds, "t", []record{{id: "new-0"}, {id: "new-1"}})
	fresh := consume(2)
	var n int
	require.NoError(t, db.QueryRow("SELECT count(*) FROM d1_effects WHERE id LIKE 'new-%'").Scan(&n))
	assert.Equal(t, 2, n, "the new topic's records ran")
	require.Len(t, fresh, 2)
	assert.NotEqual(t, old[0][len("old-0 "):], fresh[0][len("new-0 "):], "offset 0 of each incarnation has its own id")
}

// recreateTopic deletes topic and creates it again, with one partition.
func recreateTopic(t *testing.T, seeds, topic string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := kmsg.NewPtrDeleteTopicsRequest()
	dt := kmsg.NewDeleteTopicsRequestTopic()
	dt.Topic = kmsg.StringPtr(topic)
	del.Topics = append(del.Topics, dt)
	del.TopicNames = append(del.TopicNames, topic)
	dresp, err := del.RequestWith(ctx, cl)
	require.NoError(t, err)
	for _, r := range dresp.Topics {
		require.Zero(t, r.ErrorCode, "delete %s", topic)
	}
	create := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic = topic
	ct.NumPartitions = 1
	ct.ReplicationFactor = 1
	create.Topics = append(create.Topics, ct)
	cresp, err := create.RequestWith(ctx, cl)
	require.NoError(t, err)
	for _, r := range cresp.Topics {
		require.Zero(t, r.ErrorCode, "create %s", topic)
	}
}

// recv returns the next value of ch, failing the test after 30 s.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing came in 30 s")
		var zero T
		return zero
	}
}

// Positions gives a stored offset of another incarnation of the topic as
// 0, the new incarnation's start, and keeps the others. (With the IDs not
// compared, it gave 3, past the new topic's records: this test failed.)
func TestSQLOffsetsPositionsByTopicID(t *testing.T) {
	db := newStore(t).mustOpen(t)
	ctx := context.Background()
	offs := &kafka.SQLOffsets{DB: db}
	require.NoError(t, offs.Migrate(ctx))
	_, err := db.Exec("INSERT INTO idemhttp_kafka_offsets (consumer, topic, part, next_offset, topic_id) VALUES ('g', 't', 0, 3, $1), ('g', 'u', 0, 5, '')",
		"0102030405060708090a0b0c0d0e0f10")
	require.NoError(t, err)
	same := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	tests := []struct {
		name string
		ids  map[string][16]byte
		want map[string]map[int32]int64
	}{
		{name: "same topic", ids: map[string][16]byte{"t": same, "u": same}, want: map[string]map[int32]int64{"t": {0: 3}, "u": {0: 5}}},
		{name: "recreated", ids: map[string][16]byte{"t": {9}}, want: map[string]map[int32]int64{"t": {0: 0}, "u": {0: 5}}},
		{name: "no ids", want: map[string]map[int32]int64{"t": {0: 3}, "u": {0: 5}}},
	}
	for _, tt := range tests {
		got, err := offs.Positions(ctx, "g", map[string][]int32{"t": {0}, "u": {0}}, tt.ids)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, tt.name)
	}
}

// committedOffset returns the offset group committed for partition 0 of
// topic, -1 for none, asked of the cluster by a client of its own. It
// does not fail the test: a handler's goroutine calls it.
func committedOffset(seeds, group, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	rt.Partitions = []int32{0}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return 0, err
	}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if tp.Topic == topic && p.Partition == 0 {
				return p.Offset, kerr.ErrorForCode(p.ErrorCode)
			}
		}
	}
	return -1, nil
}

// A dead-lettered record's offset is committed before the next record of
// its partition runs, not only after the poll. The dead letter forgets
// the message's ledger record; left uncommitted, a later record of the
// poll that kills the member (here the producer's duplicate of the
// dead-lettered record, one id: a killer published twice) brought it back
// to the next member, which started it from no failures: dead-lettered
// again and again, the partition never got past them (internal/msgsim,
// seed 272). Checked to fail with commitDead's call taken out of
// processPartition (the duplicate's handler saw no committed offset).
func TestDeadLetterCommittedBeforeGoingOn(t *testing.T) {
	seeds := newCluster(t, "t", 1, "t-dlq")
	produce(t, seeds, "t", []record{{id: "twice", body: "first"}, {id: "twice", body: "second"}, {id: "after", body: "after"}})
	seen := make(chan string, 10)
	type offset struct {
		n   int64
		err error
	}
	atSecond := make(chan offset, 1)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: inbox.Retry{Delay: time.Millisecond, MaxDeliveries: 1}, DeadLetterTopic: "t-dlq",
		Handler: func(_ context.Context, m *inbox.Message) error {
			switch string(m.Body) {
			case "first":
				return errors.New("cannot parse")
			case "second":
				// Where a member dying here would leave the group.
				n, err := committedOffset(seeds, "g", "t")
				atSecond <- offset{n, err}
			}
			seen <- string(m.Body)
			return nil
		},
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	stop := run(t, c)
	at := recv(t, atSecond)
	require.NoError(t, at.err)
	assert.Equal(t, int64(1), at.n, "the dead letter is committed before the next record runs")
	assert.Equal(t, "second", recv(t, seen))
	assert.Equal(t, "after", recv(t, seen))
	stop()
	got := consumeAll(t, seeds, "t-dlq", 1)
	assert.Equal(t, "first", string(got[0].Value))
	n, err := committedOffset(seeds, "g", "t")
	require.NoError(t, err)
	assert.Equal(t, int64(3), n)
}

// When the commit after a dead letter fails, the partition stops there:
// the records after it wait (sought to, paused) until the poll's own
// commit has tried again, and none is lost or run twice. Checked to fail
// with commitDead going on after a failed commit (the next record ran
// with the dead letter uncommitted), and with it not seeking (the records
// after it were never delivered).
func TestDeadLetterCommitFails(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t", "t-dlq"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	seeds := cluster.ListenAddrs()[0]
	produce(t, seeds, "t", []record{{id: "poison", body: "first"}, {id: "b", body: "second"}, {id: "c", body: "after"}})
	// The group's first commit fails, whatever it commits: the one after
	// the dead letter.
	cluster.ControlKey(int16(kmsg.OffsetCommit), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.OffsetCommitRequest)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.GroupAuthorizationFailed.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	type offset struct {
		n   int64
		err error
	}
	atSecond := make(chan offset, 1)
	var mu sync.Mutex
	var ran []string
	reported := make(chan error, 10)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: inbox.Retry{Delay: 20 * time.Millisecond, MaxDeliveries: 1}, DeadLetterTopic: "t-dlq",
		Handler: func(_ context.Context, m *inbox.Message) error {
			mu.Lock()
			ran = append(ran, string(m.Body))
			mu.Unlock()
			switch string(m.Body) {
			case "first":
				return errors.New("cannot parse")
			case "second":
				n, err := committedOffset(seeds, "g", "t")
				atSecond <- offset{n, err}
			}
			return nil
		},
		OnError: func(err error) {
			select {
			case reported <- err:
			default:
			}
		},
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	stop := run(t, c)
	at := recv(t, atSecond)
	require.NoError(t, at.err)
	assert.Equal(t, int64(1), at.n, "the next record waited for the dead letter's commit")
	require.Eventually(t, func() bool {
		n, err := committedOffset(seeds, "g", "t")
		return err == nil && n == 3
	}, 30*time.Second, 10*time.Millisecond)
	stop()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"first", "second", "after"}, ran, "each once, in order")
	var sawCommit bool
	for len(reported) > 0 {
		sawCommit = sawCommit || errors.Is(<-reported, kerr.GroupAuthorizationFailed)
	}
	assert.True(t, sawCommit, "the failed commit is reported")
}
