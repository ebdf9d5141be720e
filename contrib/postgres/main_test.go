package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/internal/needs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// urlEnv names the variable holding the test server's connection string;
// .ci/services.sh prints it.
const urlEnv = "IDEMHTTP_POSTGRES_URL"

// serverURL returns the test server's connection string, or skips the
// test when none is set, for the test command's report; on CI (CI=true) a
// missing server fails instead, so that a broken setup cannot pass as a
// skip (see internal/needs).
func serverURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(urlEnv)
	if u == "" {
		needs.Missing(t, "PostgreSQL: "+urlEnv+" is not set", needs.Services)
	}
	return u
}

// testSchema is one test's private schema on the test server: its tables
// do not collide with any other test's, in this package or another.
type testSchema struct {
	url  string // the server's connection string
	name string // the schema's name, also the pools' application_name
}

// newSchema creates an empty schema with the tables of Migrate, and drops
// it when the test ends.
func newSchema(t testing.TB) *testSchema {
	t.Helper()
	s := &testSchema{url: serverURL(t), name: "idemtest_" + randomHex(6)}
	admin := s.admin(t)
	_, err := admin.Exec(context.Background(), "CREATE SCHEMA "+s.name)
	require.NoError(t, err)
	t.Cleanup(func() {
		admin := s.admin(t)
		_, err := admin.Exec(context.Background(), "DROP SCHEMA "+s.name+" CASCADE")
		require.NoError(t, err)
	})
	pool := s.pool(t, 0)
	require.NoError(t, postgres.Migrate(context.Background(), pool))
	return s
}

// admin returns a single connection outside the schema, closed when the
// test ends.
func (s *testSchema) admin(t testing.TB) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// pool returns a pool whose connections use the schema, closed when the
// test ends. maxConns zero means pgxpool's default.
func (s *testSchema) pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = s.name
	cfg.ConnConfig.RuntimeParams["application_name"] = s.name
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// newStore returns a Store on db, failing the test if it cannot be made.
func newStore(t testing.TB, db postgres.DB) *postgres.Store {
	t.Helper()
	s, err := postgres.NewStore(context.Background(), db)
	require.NoError(t, err)
	return s
}
