package kafka_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Main(m, envChild, child)
}

// groupOpts make a dead member's partitions move within a second or two,
// instead of kgo's default 45 s session timeout.
func groupOpts(seeds string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(seeds),
		kgo.SessionTimeout(1500 * time.Millisecond),
		kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.RebalanceTimeout(3 * time.Second),
		kgo.FetchMaxWait(200 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
}

// newCluster starts an in-process Kafka (franz-go's kfake) on a loopback
// port of its choosing, with topic of the given partitions, and the other
// topics (dead-letter topics) of one partition each.
func newCluster(t testing.TB, topic string, partitions int32, others ...string) string {
	t.Helper()
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topic),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}
	if len(others) > 0 {
		opts = append(opts, kfake.SeedTopics(1, others...))
	}
	c, err := kfake.NewCluster(opts...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c.ListenAddrs()[0]
}

// record is one record to produce: id goes in the message-id header
// unless empty.
type record struct {
	key, id, body string
	partition     int32
}

// fastRetry redelivers failed records after a millisecond, for tests
// about something else.
var fastRetry = inbox.Retry{Delay: time.Millisecond, MaxDelay: 10 * time.Millisecond}

// consumeAll reads n records of topic from its start, outside any group.
func consumeAll(t *testing.T, seeds, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "only %d of %d records of %s", len(out), n, topic)
		out = append(out, fs.Records()...)
	}
	return out
}

// headers returns r's headers as a map, the ones of this package only.
func headers(r *kgo.Record) map[string]string {
	m := make(map[string]string)
	for _, h := range r.Headers {
		if strings.HasPrefix(h.Key, "idemhttp-") {
			m[h.Key] = string(h.Value)
		}
	}
	return m
}

func produce(t *testing.T, seeds, topic string, rs []record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	defer cl.Close()
	recs := make([]*kgo.Record, len(rs))
	for i, r := range rs {
		recs[i] = &kgo.Record{Key: []byte(r.key), Value: []byte(r.body), Partition: r.partition}
		if r.id != "" {
			recs[i].Headers = []kgo.RecordHeader{{Key: "message-id", Value: []byte(r.id)}}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, recs...).FirstErr())
}

// store is the effects' database for a test: a private schema on the
// PostgreSQL server of .ci/services.sh when IDEMHTTP_POSTGRES_URL is set,
// else an embedded SQLite file. dsn says how a child process opens it.
type store struct {
	driver, dsn string
}

func newStore(t *testing.T) store {
	t.Helper()
	if os.Getenv(testenv.PostgresEnv) != "" {
		return store{driver: "pgx", dsn: testenv.NewSchema(t, "d1_kafka_").URL}
	}
	return store{driver: "sqlite", dsn: filepath.Join(t.TempDir(), "effects.db")}
}

func (s store) open() (*sql.DB, error) {
	if s.driver == "sqlite" {
		return sqlite.Open(s.dsn)
	}
	return sql.Open(s.driver, s.dsn)
}

func (s store) mustOpen(t *testing.T) *sql.DB {
	t.Helper()
	db, err := s.open()
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
