package kafka_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/sqlite"
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
// port of its choosing, with topic of the given partitions.
func newCluster(t *testing.T, topic string, partitions int32) string {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(partitions, topic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond),
	)
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
