// Package testenv is the test scaffolding that idemhttp's consumer modules
// (contrib/kafka, contrib/nats, contrib/rabbitmq, contrib/sqs and
// examples/consumer) share: the servers that .ci/services.sh starts, a
// private PostgreSQL schema per test, the effects table their tests count
// executions in, and the child processes their crash tests SIGKILL.
//
// It is a module of its own so that its dependencies (testify, goleak,
// pgx's database/sql driver) stay out of the root module, and internal so
// that nobody outside idemhttp can import it. It is released with the
// other modules (the go command needs it to tidy a module that requires a
// consumer module, see RELEASING.md), but it is no API: it changes
// whenever the tests need it to.
//
// Every helper takes the test's [testing.TB], fails the test on a
// setup error, and cleans up with [testing.TB.Cleanup]. None is safe to
// call from a goroutine other than the test's.
package testenv

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/needs"
)

// The variables naming the test servers; `bash .ci/services.sh` prints
// them.
const (
	PostgresEnv = "IDEMHTTP_POSTGRES_URL"
	AMQPEnv     = "IDEMHTTP_AMQP_URL"
	NATSEnv     = "IDEMHTTP_NATS_URL"
)

// Main is a package's TestMain: when the variable childEnv is set, the
// binary is a child process a crash test started, and Main exits with
// child's result; otherwise it runs the tests under
// [goleak.VerifyTestMain]. An empty childEnv means the package starts no
// child.
func Main(m *testing.M, childEnv string, child func() int) {
	if childEnv != "" && os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}

// Server returns the value of the variable name (one of [PostgresEnv],
// [AMQPEnv], [NATSEnv]), or skips the test when it is not set, for the
// test command's report. On CI (CI=true) a missing server fails the test
// instead, so that a broken setup cannot pass as a skip (see
// internal/needs).
func Server(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		needs.Missing(t, serverNames[name]+": "+name+" is not set", needs.Services)
	}
	return v
}

// serverNames names the server each variable points at.
var serverNames = map[string]string{PostgresEnv: "PostgreSQL", AMQPEnv: "RabbitMQ", NATSEnv: "NATS"}

// RandomHex returns 2n random lowercase hex digits, for names private to
// one test (schemas, queues, streams, topics) on servers other tests
// share.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b) // never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// MsgID is the i-th message id of a test: "msg-" and i in five digits, so
// that ids sort in the order they were made.
func MsgID(i int) string { return fmt.Sprintf("msg-%05d", i) }

// Schema is a PostgreSQL schema private to one test.
type Schema struct {
	// Name is the schema's name.
	Name string
	// URL is the server's connection string with search_path set to the
	// schema: a child process opens it with sql.Open("pgx", URL).
	URL string
}

// NewSchema creates a schema named prefix followed by random hex digits on
// the server of [PostgresEnv] (skipping the test when there is none; see
// [Server]) and drops it, with everything in it, when the test ends.
func NewSchema(t testing.TB, prefix string) *Schema {
	t.Helper()
	url := Server(t, PostgresEnv)
	s := &Schema{Name: prefix + RandomHex(6)}
	s.URL = WithSearchPath(url, s.Name)
	admin, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	_, err = admin.Exec("CREATE SCHEMA " + s.Name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec("DROP SCHEMA " + s.Name + " CASCADE") })
	return s
}

// Open returns a database/sql pool whose connections use the schema,
// closed when the test ends.
func (s *Schema) Open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", s.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// EffectsDB is [NewSchema] with an effects table (see [CreateEffects]) in
// it, and a pool on it (see [Schema.Open]).
func EffectsDB(t testing.TB, prefix string) (*sql.DB, *Schema) {
	t.Helper()
	s := NewSchema(t, prefix)
	db := s.Open(t)
	CreateEffects(t, db)
	return db, s
}

// WithSearchPath returns the connection string url with search_path set
// to schema.
func WithSearchPath(url, schema string) string {
	if strings.Contains(url, "?") {
		return url + "&search_path=" + schema
	}
	return url + "?search_path=" + schema
}

// EffectsSchema creates the table effects (msg_id text NOT NULL), valid
// on PostgreSQL and SQLite: one row per execution of a message's effect,
// so that counting rows counts executions.
const EffectsSchema = `CREATE TABLE effects (msg_id text NOT NULL)`

// Execer is what [InsertEffect] writes through: a *sql.DB (an effect on
// its own, as a naive consumer commits it) or a *sql.Tx (an effect in the
// inbox's transaction).
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// CreateEffects creates the effects table (see [EffectsSchema]) in db.
func CreateEffects(t testing.TB, db *sql.DB) {
	t.Helper()
	_, err := db.Exec(EffectsSchema)
	require.NoError(t, err)
}

// InsertEffect runs one execution of the effect of the message id: a row
// in effects.
func InsertEffect(ctx context.Context, ex Execer, id string) error {
	_, err := ex.ExecContext(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, id)
	return err
}

// Effects returns the number of rows in effects and of distinct message
// ids among them: executions, and messages executed.
func Effects(t testing.TB, db *sql.DB) (rows, distinct int) {
	t.Helper()
	require.NoError(t, db.QueryRow(`SELECT count(*), count(DISTINCT msg_id) FROM effects`).Scan(&rows, &distinct))
	return rows, distinct
}

// EffectHandler returns the handler of a crash test's consumer: in mode
// "inbox", [InsertEffect] in the transaction of db's [inbox.SQL] (default
// table) as consumer; in mode "naive", InsertEffect committed on its own,
// the consumer the inbox is compared with. Any other mode panics.
func EffectHandler(mode string, db *sql.DB, consumer string) inbox.Handler {
	switch mode {
	case "naive":
		return func(ctx context.Context, m *inbox.Message) error { return InsertEffect(ctx, db, m.ID) }
	case "inbox":
		return (&inbox.SQL{DB: db}).Handle(consumer, func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
			return InsertEffect(ctx, tx, m.ID)
		})
	}
	panic("testenv: unknown mode " + mode)
}

// CrashUntilDone is the loop of a crash test over total messages whose
// effects go to db's effects table: as long as some message has no effect,
// it calls runChild with a crash point drawn from 1 to maxAfter (the
// child is to SIGKILL itself after that many effects, see [DieAfter] and
// [RunChild]), and returns how many children it ran. It fails the test
// after 200 children. The seed of the crash points is logged.
func CrashUntilDone(t testing.TB, db *sql.DB, total, maxAfter int, runChild func(crashAfter int)) (crashes int) {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	for {
		if _, distinct := Effects(t, db); distinct == total {
			return crashes
		}
		require.Less(t, crashes, 200, "no progress")
		runChild(1 + rng.IntN(maxAfter))
		crashes++
	}
}

// AssertEffects checks a crash test's outcome in db's effects table:
// every one of the total messages has an effect and, in mode "inbox", only
// one, while in mode "naive" (no inbox: the check that the test can fail)
// some ran twice.
func AssertEffects(t testing.TB, mode string, db *sql.DB, total, crashes int) {
	t.Helper()
	rows, distinct := Effects(t, db)
	t.Logf("%s: %d crashes, %d effect rows for %d messages", mode, crashes, rows, total)
	assert.Equal(t, total, distinct, "every message's effect ran")
	if mode == "inbox" {
		assert.Equal(t, total, rows, "no effect ran twice")
	} else {
		assert.Greater(t, rows, total, "the naive consumer ran effects twice")
	}
}

// Go runs run in a goroutine with a context it cancels when the test
// ends, and returns run's result channel (buffered) and the function that
// cancels the context. The cleanup waits for run to return, so no
// goroutine outlives the test.
func Go(t testing.TB, run func(ctx context.Context) error) (<-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		errc <- run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return errc, cancel
}

// Wait returns the next value of errc, failing the test when none comes
// within 30 s.
func Wait(t testing.TB, errc <-chan error) error {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case err := <-errc:
		return err
	case <-timer.C:
		t.Fatal("Run did not return in 30 s")
		return nil
	}
}

// PoisonHandler is the handler of a poison-message test: it fails every
// delivery of the message whose id is Poison, noting when, and succeeds
// for every other message, noting the order. It is safe for concurrent
// use.
type PoisonHandler struct {
	// Poison is the id of the message that always fails.
	Poison string

	mu    sync.Mutex
	fails []time.Time
	order []string
}

// Handle is the [inbox.Handler].
func (p *PoisonHandler) Handle(_ context.Context, m *inbox.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.order = append(p.order, m.ID)
	if m.ID != p.Poison {
		return nil
	}
	p.fails = append(p.fails, time.Now())
	return errors.New("cannot parse the order")
}

// Order returns the ids of the deliveries so far, in order.
func (p *PoisonHandler) Order() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.order)
}

// AssertRedeliveries checks that the poison message was delivered
// deliveries times, each redelivery at least r's delay after the one
// before (a lower bound: a timer never fires early).
func (p *PoisonHandler) AssertRedeliveries(t testing.TB, r inbox.Retry, deliveries int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Len(t, p.fails, deliveries)
	for i := 1; i < len(p.fails); i++ {
		assert.GreaterOrEqual(t, p.fails[i].Sub(p.fails[i-1]), r.After(i), "redelivery %d waited its delay", i)
	}
}
