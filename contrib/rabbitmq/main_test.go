package rabbitmq_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The crash tests run this binary again as the consumer they kill.
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}

// The variables naming the test servers; .ci/services.sh prints them.
const (
	amqpEnv = "IDEMHTTP_AMQP_URL"
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

// dial opens a connection to the test broker, closed when the test ends.
func dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(serverEnv(t, amqpEnv))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// channel opens a channel on conn, closed when the test ends.
func channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// newQueue declares a queue private to the test, deleted when it ends.
// args are its arguments (nil for none).
func newQueue(t testing.TB, conn *amqp.Connection, args amqp.Table) string {
	t.Helper()
	name := "d2-" + randomHex(6)
	ch := channel(t, conn)
	_, err := ch.QueueDeclare(name, false, false, false, false, args)
	require.NoError(t, err)
	t.Cleanup(func() {
		// A fresh connection: the test may have closed its own.
		c, err := amqp.Dial(os.Getenv(amqpEnv))
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
	return name
}

// publish sends msgs to queue through the default exchange and waits for
// the broker's confirmation of each.
func publish(t testing.TB, conn *amqp.Connection, queue string, msgs ...amqp.Publishing) {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		require.NoError(t, err)
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "broker nacked a publish")
	}
}

// ready returns how many messages of queue wait for a consumer (not
// counting those delivered and not yet acknowledged).
func ready(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// newSchema creates a PostgreSQL schema private to the test (dropped when
// it ends) and returns a database/sql pool whose connections use it.
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
	db = openSchema(t, url, schema)
	_, err = db.Exec(`CREATE TABLE effects (msg_id text NOT NULL, at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	return db, schema
}

// openSchema opens a pool on schema of the server at url.
func openSchema(t testing.TB, url, schema string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", withSearchPath(url, schema))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func withSearchPath(url, schema string) string {
	sep := "?"
	for _, c := range url {
		if c == '?' {
			sep = "&"
		}
	}
	return url + sep + "search_path=" + schema
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
