package nats_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The crash test runs this binary again as the consumer it kills.
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}

// The variables naming the test servers; .ci/services.sh prints them.
const (
	natsEnv = "IDEMHTTP_NATS_URL"
	pgEnv   = "IDEMHTTP_POSTGRES_URL"
)

// serverEnv returns the variable's value, or skips the test when it is
// not set; on CI (CI=true) a missing server fails instead, so that a broken
// setup cannot pass as a skip.
func serverEnv(t testing.TB, name string) string {
	t.Helper()
	if v := os.Getenv(name); v != "" {
		return v
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set: on CI, run `eval \"$(bash .ci/services.sh)\"` before the tests", name)
	}
	t.Skipf("%s is not set: start the servers with `eval \"$(bash .ci/services.sh)\"` to run this test", name)
	return ""
}

// connect opens a connection to the test server, closed when the test
// ends, and its JetStream context.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(serverEnv(t, natsEnv))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

// testStream is a stream private to one test, with one durable pull
// consumer, deleted when the test ends.
type testStream struct {
	name     string // stream name
	subject  string // the subject its messages are published on
	consumer string // the durable consumer's name
}

// newStream creates a stream and its consumer with the given AckWait.
func newStream(t testing.TB, js jetstream.JetStream, ackWait time.Duration) *testStream {
	t.Helper()
	id := randomHex(6)
	s := &testStream{name: "D2_" + strings.ToUpper(id), subject: "d2." + id, consumer: "d2-" + id}
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.subject}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.name) })
	_, err = js.CreateOrUpdateConsumer(ctx, s.name, jetstream.ConsumerConfig{
		Durable:   s.consumer,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   ackWait,
	})
	require.NoError(t, err)
	return s
}

// cons returns a handle on the stream's consumer.
func (s *testStream) cons(t testing.TB, js jetstream.JetStream) jetstream.Consumer {
	t.Helper()
	c, err := js.Consumer(context.Background(), s.name, s.consumer)
	require.NoError(t, err)
	return c
}

// publish publishes a message per id (an empty id: no Nats-Msg-Id) and
// waits for each PubAck.
func (s *testStream) publish(t testing.TB, js jetstream.JetStream, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, 0, len(ids))
	for _, id := range ids {
		msg := nats.NewMsg(s.subject)
		msg.Data = []byte("body of " + id)
		var opts []jetstream.PublishOpt
		if id != "" {
			opts = append(opts, jetstream.WithMsgID(id))
		}
		f, err := js.PublishMsgAsync(msg, opts...)
		require.NoError(t, err)
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("no PubAck in 30 s")
		}
	}
}

// settled reports whether the consumer has nothing left to deliver and
// nothing delivered and unacknowledged.
func (s *testStream) settled(t testing.TB, js jetstream.JetStream) bool {
	t.Helper()
	info, err := s.cons(t, js).Info(context.Background())
	require.NoError(t, err)
	return info.NumPending == 0 && info.NumAckPending == 0
}

// newSchema creates a PostgreSQL schema private to the test (dropped when
// it ends) with an effects table, and returns a pool on it.
func newSchema(t testing.TB) (db *sql.DB, schema string) {
	t.Helper()
	url := serverEnv(t, pgEnv)
	schema = "d2_" + randomHex(6)
	admin, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	_, err = admin.Exec("CREATE SCHEMA " + schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE") })
	db, err = sql.Open("pgx", withSearchPath(url, schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE effects (msg_id text NOT NULL)`)
	require.NoError(t, err)
	return db, schema
}

func withSearchPath(url, schema string) string {
	if strings.Contains(url, "?") {
		return url + "&search_path=" + schema
	}
	return url + "?search_path=" + schema
}

// effects returns the number of effect rows and of distinct message ids
// among them.
func effects(t testing.TB, db *sql.DB) (rows, distinct int) {
	t.Helper()
	require.NoError(t, db.QueryRow(`SELECT count(*), count(DISTINCT msg_id) FROM effects`).Scan(&rows, &distinct))
	return rows, distinct
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

func msgID(i int) string { return fmt.Sprintf("msg-%05d", i) }
