package postgres_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The PostgreSQL side of the transactional benchmarks: the CPU time of the
// server processes behind a pool's connections, read from /proc when the
// server runs on this machine, so that a benchmark can say what each
// request costs the database, side by side with its baseline.

// backends records the server processes (backends) of a pool's
// connections and their CPU time at a mark.
type backends struct {
	mu   sync.Mutex
	base map[uint32]time.Duration // a backend's CPU time at the mark; 0 for one begun since
}

// backendPool returns a pool on s whose backends are recorded in bk.
func backendPool(t testing.TB, s *testSchema, maxConns int32, bk *backends) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = s.name
	cfg.ConnConfig.RuntimeParams["application_name"] = s.name
	cfg.MaxConns = maxConns
	bk.base = map[uint32]time.Duration{}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		bk.mu.Lock()
		defer bk.mu.Unlock()
		bk.base[c.PgConn().PID()] = 0
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// mark makes now the point from which since counts. It returns false when
// the backends' CPU time cannot be read: the server runs elsewhere.
func (bk *backends) mark() bool {
	bk.mu.Lock()
	defer bk.mu.Unlock()
	for pid := range bk.base {
		cpu, ok := backendCPU(pid)
		if !ok {
			return false
		}
		bk.base[pid] = cpu
	}
	return len(bk.base) > 0
}

// since returns the CPU time the backends spent since the mark (a backend
// that ended since is not counted: a pool ends none while it is busy).
func (bk *backends) since() time.Duration {
	bk.mu.Lock()
	defer bk.mu.Unlock()
	var sum time.Duration
	for pid, base := range bk.base {
		if cpu, ok := backendCPU(pid); ok {
			sum += cpu - base
		}
	}
	return sum
}

// backendCPU returns the CPU time of process pid, in nanoseconds from
// /proc/pid/schedstat (the tick counts of /proc/pid/stat are too coarse
// for a process that runs for a few milliseconds at a time), if it is a
// PostgreSQL process on this machine.
func backendCPU(pid uint32) (time.Duration, bool) {
	dir := "/proc/" + strconv.FormatUint(uint64(pid), 10)
	comm, err := os.ReadFile(dir + "/comm")
	if err != nil || !strings.HasPrefix(string(comm), "postgres") {
		return 0, false
	}
	stat, err := os.ReadFile(dir + "/schedstat")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(stat))
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}

// hotUpdates returns how many updates of the key table in s the server
// counted, and how many of them were HOT (heap-only: no index entry
// written). The backends report their counts when they end or go idle,
// so close the pools first; it waits until the counts stop moving for a
// second, at most five.
func hotUpdates(t testing.TB, s *testSchema) (updates, hot int64) {
	t.Helper()
	conn := s.admin(t)
	deadline := time.Now().Add(5 * time.Second)
	last, still := int64(-1), 0
	for time.Now().Before(deadline) && still < 10 {
		err := conn.QueryRow(context.Background(), `
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
WHERE schemaname = $1 AND relname = 'idemhttp_keys'`, s.name).Scan(&updates, &hot)
		if err != nil {
			return 0, 0
		}
		if updates == last && updates > 0 {
			still++
		} else {
			last, still = updates, 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	return updates, hot
}
