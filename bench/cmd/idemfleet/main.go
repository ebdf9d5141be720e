// Command idemfleet measures how idemhttp's PostgreSQL-backed parts scale
// out, each against one PostgreSQL: a fleet of worker processes working
// through a batch on the fleet journal (contrib/postgres.Journal), and
// idemserver.Middleware instances sharing the PostgreSQL Store. It prints a
// Markdown table per part (bench/README.md, "Scale-out").
//
//	eval "$(bash bench/fleet/pg.sh)"   # a PostgreSQL of its own, with pg_stat_statements
//	go run ./bench/cmd/idemfleet       # both parts, 1, 2, 4 and 8 workers; 1 and 2 servers
//	go run ./bench/cmd/idemfleet -only journal -workers 1,8 -entries 8000
//
// Journal: a producer enqueues -entries pending entries (one POST each),
// then -workers worker processes (this program again, started with
// IDEMFLEET_CHILD set) run the package's worker loop at once: ClaimPending
// up to -batch entries, Client.Resume of those entries -conc at a time,
// until none is left. The Client's transport answers at once (201): what
// is measured is the journal, the claim and a resend's journal work
// (its reread, its outcome), not a server. Throughput is entries resolved
// per second, from the go signal to the last worker's end.
//
// Server: -servers idemserver.Middleware processes, each with a Store on
// the same database around a handler that answers 201 at once, and
// -clients goroutines here sending POSTs with fresh keys to them in turn
// for -duration: claims and completes per second.
//
// Each run gets a schema of its own. With pg_stat_statements in the
// database (bench/fleet/pg.sh loads it) the table says where the
// database's time went, per statement; a sampler reads pg_stat_activity's
// wait events every 50 ms during the run (and pg_locks, with the blocking
// statement, when a backend waits for a lock); with
// IDEMFLEET_PG_PID (the postmaster's pid, which pg.sh prints) it also
// reads the database's CPU time from /proc. Progress goes to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

const childEnv = "IDEMFLEET_CHILD"

func main() {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	var (
		pgURL    = flag.String("pg", cmpOr(os.Getenv("IDEMFLEET_PG_URL"), os.Getenv("IDEMHTTP_POSTGRES_URL")), "PostgreSQL URL (default $IDEMFLEET_PG_URL, else $IDEMHTTP_POSTGRES_URL)")
		only     = flag.String("only", "journal,server", "parts to run: journal, server")
		workers  = flag.String("workers", "1,2,4,8", "worker process counts (journal)")
		entries  = flag.Int("entries", 6000, "entries per journal run")
		batch    = flag.Int("batch", 16, "ClaimPending limit per claim")
		conc     = flag.Int("conc", 16, "resends at once per worker (ResumeOptions.Concurrency)")
		servers  = flag.String("servers", "1,2", "server process counts (server)")
		clients  = flag.Int("clients", 64, "concurrent requests (server)")
		duration = flag.Duration("duration", 10*time.Second, "length of a server run")
		syncOff  = flag.Bool("sync-off", false, "diagnosis only: the workers' and servers' sessions commit with synchronous_commit off (no wait for the WAL on disk; a crash may lose acknowledged writes)")
	)
	flag.Parse()
	if *syncOff {
		os.Setenv("IDEMFLEET_SYNC_OFF", "1") // the children inherit it
	}
	if *pgURL == "" {
		fatal(errors.New("no PostgreSQL: eval \"$(bash bench/fleet/pg.sh)\", or -pg URL"))
	}
	ctx := context.Background()
	for _, part := range strings.Split(*only, ",") {
		switch part {
		case "journal":
			var rows []runStats
			for _, w := range ints(*workers) {
				s, err := runJournal(ctx, *pgURL, w, *entries, *batch, *conc)
				if err != nil {
					fatal(err)
				}
				rows = append(rows, s)
			}
			printTable(fmt.Sprintf("Fleet journal: %d entries, ClaimPending(%d), Resume %d at a time per worker, instant answers%s", *entries, *batch, *conc, syncNote(*syncOff)), "workers", rows)
		case "server":
			var rows []runStats
			for _, n := range ints(*servers) {
				s, err := runServers(ctx, *pgURL, n, *clients, *duration)
				if err != nil {
					fatal(err)
				}
				rows = append(rows, s)
			}
			printTable(fmt.Sprintf("idemserver with the PostgreSQL Store: %d clients, fresh keys, %s per run%s", *clients, *duration, syncNote(*syncOff)), "servers", rows)
		default:
			fatal(fmt.Errorf("unknown part %q", part))
		}
	}
}

func syncNote(off bool) string {
	if off {
		return "; synchronous_commit off (diagnosis: not durable)"
	}
	return ""
}

// runStats is one run's row.
type runStats struct {
	procs      int
	ops        int64
	elapsed    time.Duration
	errors     int64
	load       float64       // 1-minute load average at the start
	pgCPU      time.Duration // the database's processes, if known
	clientCPU  time.Duration // the workers' or servers' processes
	stmts      []stmtStat
	waits      map[string]int // wait event (or "CPU") -> samples of active backends
	samples    int
	locks      map[string]int // lock type and mode, waiting -> samples
	commits    int64
	walSyncs   int64
	walSyncMs  float64
	maxBackend int // most client backends active at once
}

type stmtStat struct {
	query   string
	calls   int64
	totalMs float64
}

// runJournal loads entries pending entries into a fresh schema and has
// workers processes work through them.
func runJournal(ctx context.Context, base string, workers, entries, batch, conc int) (runStats, error) {
	url, drop, err := freshSchema(ctx, base, fmt.Sprintf("fleet_j%d", workers))
	if err != nil {
		return runStats{}, err
	}
	defer drop()
	logf("journal, %d worker(s): loading %d entries", workers, entries)
	if err := load(ctx, url, entries); err != nil {
		return runStats{}, err
	}
	env := []string{"IDEMFLEET_URL=" + url, "IDEMFLEET_BATCH=" + strconv.Itoa(batch), "IDEMFLEET_CONC=" + strconv.Itoa(conc)}
	var children []*proc
	for i := range workers {
		c, err := start("worker", append(env, "IDEMFLEET_WORKER="+strconv.Itoa(i)))
		if err != nil {
			return runStats{}, err
		}
		children = append(children, c)
	}
	defer func() {
		for _, c := range children {
			c.kill()
		}
	}()
	s, err := measure(ctx, url, func() error {
		for _, c := range children {
			if err := c.tell("go"); err != nil {
				return err
			}
		}
		return nil
	}, func() error {
		for _, c := range children {
			var r childReport
			if err := c.report(&r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s, err
	}
	s.procs = workers
	for _, c := range children {
		s.ops += c.last.Done
		s.errors += c.last.Errors
		s.clientCPU += c.last.CPU
	}
	if s.ops != int64(entries) {
		return s, fmt.Errorf("journal run: %d of %d entries resolved", s.ops, entries)
	}
	return s, nil
}

// runServers starts n server processes on a fresh schema and sends
// requests to them from clients goroutines for d.
func runServers(ctx context.Context, base string, n, clients int, d time.Duration) (runStats, error) {
	url, drop, err := freshSchema(ctx, base, fmt.Sprintf("fleet_s%d", n))
	if err != nil {
		return runStats{}, err
	}
	defer drop()
	var children []*proc
	var addrs []string
	for range n {
		c, err := start("server", []string{"IDEMFLEET_URL=" + url})
		if err != nil {
			return runStats{}, err
		}
		children = append(children, c)
		addrs = append(addrs, c.ready)
	}
	defer func() {
		for _, c := range children {
			c.kill()
		}
	}()
	logf("server, %d instance(s) at %s: %d clients for %s", n, strings.Join(addrs, ", "), clients, d)
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	var ops, errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	s, err := measure(ctx, url, func() error {
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				target := "http://" + addrs[i%n] + "/v1/charges"
				for {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(`{"amount":1000,"currency":"usd"}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", idemhttp.NewKey())
					resp, err := hc.Do(req)
					if err != nil {
						errs.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						errs.Add(1)
						continue
					}
					ops.Add(1)
				}
			}()
		}
		return nil
	}, func() error {
		time.Sleep(d)
		close(stop)
		wg.Wait()
		for _, c := range children {
			if err := c.tell("stop"); err != nil {
				return err
			}
			var r childReport
			if err := c.report(&r); err != nil {
				return err
			}
		}
		return nil
	})
	s.procs, s.ops, s.errors = n, ops.Load(), errs.Load()
	for _, c := range children {
		s.clientCPU += c.last.CPU
	}
	return s, err
}

// measure runs begin, then end (which returns once the run is over),
// timing the run and sampling the database meanwhile.
func measure(ctx context.Context, url string, begin, end func() error) (runStats, error) {
	var s runStats
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		return s, err
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "SELECT public.pg_stat_statements_reset()")
	haveStatements := err == nil
	_ = admin.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&s.commits)
	var syncs0 int64
	var syncMs0 float64
	_ = admin.QueryRow(ctx, "SELECT wal_sync, wal_sync_time FROM pg_stat_wal").Scan(&syncs0, &syncMs0)
	pg0 := pgCPU()
	s.load = loadAvg()
	s.waits, s.locks = map[string]int{}, map[string]int{}

	sampler, err := pgx.Connect(ctx, url)
	if err != nil {
		return s, err
	}
	defer sampler.Close(ctx)
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			sample(ctx, sampler, &s)
		}
	}()
	start := time.Now()
	err = begin()
	if err == nil {
		err = end()
	}
	s.elapsed = time.Since(start)
	close(done)
	<-sampled
	if err != nil {
		return s, err
	}
	if pg0 >= 0 {
		s.pgCPU = pgCPU() - pg0
	}
	var commits int64
	_ = admin.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(&commits)
	s.commits = commits - s.commits
	var syncs int64
	var syncMs float64
	if admin.QueryRow(ctx, "SELECT wal_sync, wal_sync_time FROM pg_stat_wal").Scan(&syncs, &syncMs) == nil {
		s.walSyncs, s.walSyncMs = syncs-syncs0, syncMs-syncMs0
	}
	if haveStatements {
		rows, err := admin.Query(ctx, `SELECT query, calls, total_exec_time FROM public.pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_locks%'
			ORDER BY total_exec_time DESC LIMIT 6`)
		if err == nil {
			for rows.Next() {
				var st stmtStat
				if rows.Scan(&st.query, &st.calls, &st.totalMs) == nil {
					s.stmts = append(s.stmts, st)
				}
			}
			rows.Close()
		}
	}
	return s, nil
}

// sample counts what the run's backends wait for, and the locks they
// wait on, now.
func sample(ctx context.Context, c *pgx.Conn, s *runStats) {
	rows, err := c.Query(ctx, `SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND state = 'active'
		GROUP BY 1`)
	if err != nil {
		return
	}
	active, lockWaits := 0, false
	for rows.Next() {
		var w string
		var n int
		if rows.Scan(&w, &n) == nil {
			s.waits[w] += n
			active += n
			lockWaits = lockWaits || strings.HasPrefix(w, "Lock:")
		}
	}
	rows.Close()
	s.samples++
	s.maxBackend = max(s.maxBackend, active)
	if !lockWaits {
		return // pg_locks costs the database more than the rest: only when someone waits
	}
	// Who waits for a lock, on what, and behind which statement.
	rows, err = c.Query(ctx, `SELECT l.locktype || ' ' || l.mode, w.query, coalesce(b.query, '?') FROM pg_locks l
		JOIN pg_stat_activity w ON w.pid = l.pid
		LEFT JOIN pg_stat_activity b ON b.pid = (pg_blocking_pids(l.pid))[1]
		WHERE w.datname = current_database() AND NOT l.granted`)
	if err != nil {
		return
	}
	for rows.Next() {
		var l, wq, bq string
		if rows.Scan(&l, &wq, &bq) == nil {
			s.locks[fmt.Sprintf("%s: `%s` behind `%s`", l, short(wq), short(bq))]++
		}
	}
	rows.Close()
}

// freshSchema creates a schema of its own and returns base with its
// search_path, and a function that drops it.
func freshSchema(ctx context.Context, base, prefix string) (string, func(), error) {
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	c, err := pgx.Connect(ctx, base)
	if err != nil {
		return "", nil, err
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", nil, err
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return "", nil, err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return "", nil, err
	}
	return u.String(), func() {
		c, err := pgx.Connect(context.Background(), base)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
			c.Close(context.Background())
		}
	}, nil
}

// load enqueues n pending entries, 32 at once, with synchronous_commit
// off (the load is not what is measured).
func load(ctx context.Context, url string, n int) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "producer"})
	var next atomic.Int64
	errc := make(chan error, 32)
	for range 32 {
		go func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				u := fmt.Sprintf("http://api.test/v1/charges/%d", i)
				body := []byte(fmt.Sprintf(`{"amount":1000,"currency":"usd","op":%d}`, i))
				e := &idemhttp.Entry{Operation: fmt.Sprintf("op-%07d", i), Key: idemhttp.NewKey(), Method: http.MethodPost, URL: u,
					Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
				if _, err := j.Enqueue(ctx, e); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range 32 {
		if err := <-errc; err != nil {
			return err
		}
	}
	_, err = pool.Exec(ctx, "VACUUM ANALYZE idemhttp_journal")
	return err
}

// childReport is what a child prints when it is done.
type childReport struct {
	Done   int64         `json:"done"`
	Errors int64         `json:"errors"`
	CPU    time.Duration `json:"cpu"`
}

// child runs a worker or a server process.
func child(mode string) int {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("IDEMFLEET_URL"))
	if err != nil {
		return childFail(err)
	}
	if os.Getenv("IDEMFLEET_SYNC_OFF") != "" {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	conc := max(envInt("IDEMFLEET_CONC"), 1)
	cfg.MaxConns = int32(conc + 4)
	if mode == "server" {
		cfg.MaxConns = 64
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return childFail(err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return childFail(err)
	}
	in := bufio.NewScanner(os.Stdin)
	switch mode {
	case "worker":
		fmt.Println("ready")
		if !in.Scan() {
			return childFail(errors.New("no go signal"))
		}
		return work(ctx, pool, envInt("IDEMFLEET_BATCH"), conc)
	case "server":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return childFail(err)
		}
		store, err := postgres.NewStore(ctx, pool)
		if err != nil {
			return childFail(err)
		}
		mw := &idemserver.Middleware{Store: store, SingleTenant: true}
		srv := &http.Server{Handler: mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
		}))}
		go func() { _ = srv.Serve(ln) }()
		fmt.Println(ln.Addr().String())
		in.Scan() // "stop", or the parent's end
		_ = srv.Shutdown(ctx)
		return report(childReport{})
	}
	return childFail(fmt.Errorf("unknown child mode %q", mode))
}

// work is the package documentation's worker loop, until no entry is
// left pending.
func work(ctx context.Context, pool *pgxpool.Pool, batch, conc int) int {
	j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "worker-" + os.Getenv("IDEMFLEET_WORKER")})
	c := &idemhttp.Client{Journal: j, HTTPClient: &http.Client{Transport: instant{}}}
	var r childReport
	for {
		entries, err := j.ClaimPending(ctx, max(batch, 1))
		if err != nil {
			return childFail(err)
		}
		if len(entries) == 0 {
			var left int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM idemhttp_journal WHERE state = 'pending'").Scan(&left); err != nil {
				return childFail(err)
			}
			if left == 0 {
				return report(r)
			}
			time.Sleep(5 * time.Millisecond) // others hold them; one may die
			continue
		}
		results, err := c.Resume(ctx, &idemhttp.ResumeOptions{Entries: entries, Concurrency: conc})
		if err != nil {
			return childFail(err)
		}
		for _, res := range results {
			if res.Err != nil {
				r.Errors++
				continue
			}
			r.Done++
		}
	}
}

// instant answers every request at once with a 201.
type instant struct{}

func (instant) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusCreated, Status: "201 Created", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: http.NoBody, Request: r}, nil
}

func report(r childReport) int {
	r.CPU = selfCPU()
	b, _ := json.Marshal(r)
	fmt.Println(string(b))
	return 0
}

func childFail(err error) int {
	fmt.Fprintln(os.Stderr, "idemfleet child:", err)
	return 1
}

// proc is a child process.
type proc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	ready string // its first line
	last  childReport
}

func start(mode string, env []string) (*proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(append(os.Environ(), childEnv+"="+mode), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	if !p.out.Scan() {
		p.kill()
		return nil, fmt.Errorf("%s child did not start", mode)
	}
	p.ready = p.out.Text()
	return p, nil
}

func (p *proc) tell(s string) error {
	_, err := io.WriteString(p.in, s+"\n")
	return err
}

func (p *proc) report(r *childReport) error {
	if !p.out.Scan() {
		return fmt.Errorf("child ended without a report: %v", p.out.Err())
	}
	if err := json.Unmarshal(p.out.Bytes(), r); err != nil {
		return err
	}
	p.last = *r
	return nil
}

func (p *proc) kill() {
	_ = p.in.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// pgCPU returns the CPU time of the postmaster (IDEMFLEET_PG_PID) and of
// its children, live and exited, so far; -1 if unknown. A backend that
// exits (its client's pool closed) leaves /proc, and its time moves into
// the postmaster's cutime and cstime, which reaps it.
func pgCPU() time.Duration {
	root, err := strconv.Atoi(os.Getenv("IDEMFLEET_PG_PID"))
	if err != nil {
		return -1
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var ticks int64
	found := false
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		// After the command (which may hold spaces): state(1) ppid(2) ...
		// utime(12) stime(13) cutime(14) cstime(15), counted from 1.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 15 {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		ppid, _ := strconv.Atoi(f[1])
		field := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
		switch {
		case pid == root:
			found = true
			ticks += field(11) + field(12) + field(13) + field(14)
		case ppid == root:
			ticks += field(11) + field(12)
		}
	}
	if !found {
		return -1
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}

func printTable(title, procs string, rows []runStats) {
	fmt.Printf("\n**%s**\n\n", title)
	fmt.Printf("| %s | ops/s | ms | errors | load | commits/op | WAL syncs/op (ms each) | DB CPU µs/op | %s CPU µs/op | active backends (max) | where active backends were (samples) |\n", procs, procs)
	fmt.Println("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, s := range rows {
		ops := float64(max(s.ops, 1))
		syncEach := 0.0
		if s.walSyncs > 0 {
			syncEach = s.walSyncMs / float64(s.walSyncs)
		}
		db := "-"
		if s.pgCPU > 0 {
			db = fmt.Sprintf("%.0f", float64(s.pgCPU.Microseconds())/ops)
		}
		fmt.Printf("| %d | %.0f | %d | %d | %.1f | %.2f | %.2f (%.2f) | %s | %.0f | %.1f (%d) | %s |\n",
			s.procs, float64(s.ops)/s.elapsed.Seconds(), s.elapsed.Milliseconds(), s.errors, s.load,
			float64(s.commits)/ops, float64(s.walSyncs)/ops, syncEach, db, float64(s.clientCPU.Microseconds())/ops,
			avg(s.waits, s.samples), s.maxBackend, top(s.waits, 5))
	}
	fmt.Println()
	for _, s := range rows {
		if len(s.locks) > 0 {
			fmt.Printf("%s %d, lock waits (samples): %s\n\n", procs, s.procs, top(s.locks, 4))
		}
		if len(s.stmts) == 0 {
			continue
		}
		fmt.Printf("%s %d, statements by database time (pg_stat_statements): ", procs, s.procs)
		var parts []string
		for _, st := range s.stmts {
			parts = append(parts, fmt.Sprintf("`%s` %d calls, %.0f µs/op", short(st.query), st.calls, st.totalMs*1000/float64(max(s.ops, 1))))
		}
		fmt.Println(strings.Join(parts, "; "))
		fmt.Println()
	}
}

func avg(m map[string]int, n int) float64 {
	t := 0
	for _, v := range m {
		t += v
	}
	return float64(t) / float64(max(n, 1))
}

func top(m map[string]int, k int) string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for key, v := range m {
		all = append(all, kv{key, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var out []string
	for i, e := range all {
		if i == k {
			break
		}
		out = append(out, fmt.Sprintf("%s %d", e.k, e.v))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ", ")
}

// short names a statement by its first words.
func short(q string) string {
	f := strings.Fields(q)
	for i, w := range f {
		if i > 0 && (w == "FROM" || w == "SET" || w == "INTO" || w == "AS") && i+1 < len(f) {
			return strings.Join(f[:min(i+2, len(f))], " ")
		}
	}
	return strings.Join(f[:min(4, len(f))], " ")
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fatal(fmt.Errorf("bad count %q", f))
		}
		out = append(out, n)
	}
	return out
}

func envInt(name string) int {
	n, _ := strconv.Atoi(os.Getenv(name))
	return n
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, "idemfleet: "+format+"\n", args...) }

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "idemfleet:", err)
	os.Exit(1)
}
