package postgres_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// baselineRequest is one line of testdata/baseline/requests.tsv: a request
// the release at commit 2d053bb served, and what it answered.
type baselineRequest struct {
	name, mode, account, key, ct, body, do string
	status                                 int
	response, charge                       string
	lock                                   int64
}

func readBaselineRequests(t *testing.T) []baselineRequest {
	t.Helper()
	f, err := os.Open("testdata/baseline/requests.tsv")
	require.NoError(t, err)
	defer f.Close()
	var out []baselineRequest
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "#") {
			continue
		}
		c := strings.Split(sc.Text(), "\t")
		require.Len(t, c, 11, sc.Text())
		q := baselineRequest{name: c[0], mode: c[1], account: c[2], key: c[3], do: c[6], charge: c[9]}
		for i, dst := range []*string{&q.ct, &q.body, &q.response} {
			*dst, err = strconv.Unquote(c[[]int{4, 5, 8}[i]])
			require.NoError(t, err, q.name)
		}
		q.status, err = strconv.Atoi(c[7])
		require.NoError(t, err)
		q.lock, err = strconv.ParseInt(c[10], 10, 64)
		require.NoError(t, err)
		out = append(out, q)
	}
	require.NoError(t, sc.Err())
	require.Len(t, out, 12)
	return out
}

// loadBaseline creates a schema holding the tables and rows the previous
// release left (testdata/baseline/keys.sql), with every row's expiry moved
// an hour from now (the dump's have long passed), and returns it.
func loadBaseline(t *testing.T) *testSchema {
	t.Helper()
	s := &testSchema{url: serverURL(t), name: "idemtest_" + randomHex(6)}
	dump, err := os.ReadFile("testdata/baseline/keys.sql")
	require.NoError(t, err)
	var sql strings.Builder
	for _, line := range strings.Split(string(dump), "\n") {
		if strings.HasPrefix(line, `\`) {
			continue // psql's meta-commands (\restrict): not SQL
		}
		sql.WriteString(strings.ReplaceAll(line, "__SCHEMA__", s.name) + "\n")
	}
	admin := s.admin(t)
	t.Cleanup(func() {
		_, err := s.admin(t).Exec(context.Background(), "DROP SCHEMA "+s.name+" CASCADE")
		require.NoError(t, err)
	})
	_, err = admin.Exec(context.Background(), sql.String())
	require.NoError(t, err)
	_, err = admin.Exec(context.Background(), `UPDATE `+s.name+`.idemhttp_keys SET expires_at = now() + interval '1 hour'`)
	require.NoError(t, err)
	return s
}

// baselineApp is the handler the release served the requests with; it
// must not run again.
func baselineApp(runs *int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		*runs++
		w.WriteHeader(http.StatusTeapot)
	}
}

func (q baselineRequest) send(h http.Handler) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(q.body))
	r.Header.Set("Idempotency-Key", q.key)
	r.Header.Set("X-Account", q.account)
	r.Header.Set("X-Do", q.do)
	r.Header.Set("Content-Type", q.ct)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestBaseline: the tables of the release users run before this one
// (commit 2d053bb), with the rows its Middleware (on the Store) and its
// TxMiddleware wrote, are upgraded in place by this release's Migrate;
// then every key they stored replays in every mode, as it was answered,
// with this release's fingerprints accepting that release's (issue 30,
// §4). The claim in progress still holds its key; the response too large
// to store still answers 410. Checked to fail with the fingerprints of
// earlier versions refused: all 24 subtests answered 422 instead.
func TestBaseline(t *testing.T) {
	s := loadBaseline(t)
	pool := s.pool(t, 4)
	require.NoError(t, postgres.Migrate(context.Background(), pool), "upgrade in place")
	require.NoError(t, postgres.Migrate(context.Background(), pool), "again: idempotent")

	account := func(r *http.Request) string { return r.Header.Get("X-Account") }
	var runs int
	mw := (&idemserver.Middleware{Store: newStore(t, pool), Principal: account, MaxStoredBody: 64, Logger: discardLogger()}).
		Wrap(http.HandlerFunc(baselineApp(&runs)))
	m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{Principal: account, MaxStoredBody: 64, Logger: discardLogger()})
	require.NoError(t, err)
	tx := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, _ pgx.Tx) error {
		baselineApp(&runs)(w, r)
		return nil
	})
	for _, q := range readBaselineRequests(t) {
		for mode, h := range map[string]http.Handler{"store": mw, "tx": tx} {
			t.Run(q.name+"/"+mode, func(t *testing.T) {
				w := q.send(h)
				switch {
				case q.name == "store-claim":
					assert.Equal(t, http.StatusConflict, w.Code, "still claimed")
				case q.name == "store-big":
					assert.Equal(t, http.StatusGone, w.Code, "ran, not replayable")
				default:
					assert.Equal(t, q.status, w.Code, w.Body.String())
					assert.Equal(t, q.response, w.Body.String())
					assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
					assert.Equal(t, q.charge, w.Header().Get("X-Charge"), "the stored header")
				}
			})
		}
	}
	assert.Zero(t, runs, "no key ran again")

	// With idemserver.PreviousFingerprint, this release computes the
	// fingerprints that release stored, which it compares byte for byte:
	// instances of both, side by side, agree on every key.
	for _, q := range readBaselineRequests(t) {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(q.body))
		r.Header.Set("Content-Type", q.ct)
		var stored []byte
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT fingerprint FROM idemhttp_keys WHERE key = $1`,
			postgres.RowKey(idemserver.ScopedKey(q.account, q.key))).Scan(&stored), q.name)
		assert.Equal(t, string(stored), idemserver.PreviousFingerprint(r, []byte(q.body)), q.name)
	}
}

// TestBaselineAdvisoryLocks: the previous release's TxMiddleware locked a
// key by the first 8 bytes of the SHA-256 of its row key alone (as the
// locks testdata/baseline recorded show); this release locks it by its
// table and row key, so that applications in two schemas never block
// each other. Instances of the two releases side by side (a rolling
// deploy) therefore do not exclude each other by the lock: what keeps a
// key from committing twice then is the key table's primary key, which
// TestRollingDeployWithPreviousRelease shows.
func TestBaselineAdvisoryLocks(t *testing.T) {
	n := 0
	for _, q := range readBaselineRequests(t) {
		if q.mode != "tx" {
			continue
		}
		assert.Equal(t, q.lock, previousLock(q.account, q.key), q.name)
		n++
	}
	assert.Equal(t, 4, n)
}

// previousLock is the previous release's advisory lock of a key, which
// TestBaselineAdvisoryLocks checks against the locks it held.
func previousLock(scope, key string) int64 {
	sum := sha256.Sum256(postgres.RowKey(idemserver.ScopedKey(scope, key)))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// TestRollingDeployWithPreviousRelease runs a request of the previous
// release's TxMiddleware (its protocol, as that release's statements
// have it: its own lock, a lookup, the handler, then the record with an
// upsert that takes over only an expired row) beside this release's on
// the same key, in both orders: the locks differ, so both handlers may
// run, but exactly one business write commits with its record, and
// neither answers 500. What holds it is the key table's primary key,
// which both releases' statements respect (the new one's claim row, in
// the request's transaction, is what the old one's record waits for);
// checked to fail with the old release's record made to overwrite a live
// row: both writes committed.
func TestRollingDeployWithPreviousRelease(t *testing.T) {
	for _, newFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "new first", false: "old first"}[newFirst], func(t *testing.T) {
			s := newTxSchema(t)
			pool := s.pool(t, 4)
			release := make(chan struct{})
			entered := make(chan struct{}, 1)
			m := newTx(t, s, 4, &postgres.TxOptions{Logger: discardLogger()})
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if newFirst {
					entered <- struct{}{}
					<-release
				}
				return chargeTx(w, r, tx)
			})
			replies := make(chan reply, 1)
			old := make(chan error, 1)
			if newFirst {
				// The new one holds its claim row; the old one runs, and
				// its record waits on that row.
				go func() { replies <- post(t, h, "k", "x") }()
				<-entered
				go func() { old <- previousRequest(pool, "k", nil, nil) }()
				waitForLockWait(t, s)
				close(release)
			} else {
				// The old one has run its handler and not yet written its
				// record; the new one runs and commits meanwhile.
				ran, cont := make(chan struct{}), make(chan struct{})
				go func() { old <- previousRequest(pool, "k", ran, cont) }()
				<-ran
				go func() { replies <- post(t, h, "k", "x") }()
				got := <-replies
				replies <- got
				close(cont)
			}
			got := <-replies
			assert.Contains(t, []int{http.StatusCreated, http.StatusConflict}, got.Status, got.Body)
			err := <-old
			assert.Len(t, charges(t, s, "k"), 1, "exactly one write committed (old: %v)", err)
		})
	}
}

// previousRequest serves a request of key as the previous release's
// TxMiddleware did, on its statements: its lock (the row key's hash),
// the key's live row, the handler's write (a charge), then the record in
// an upsert that takes over only an expired row, guarded, and COMMIT. It
// returns nil when it committed. ran, if not nil, is closed once its
// handler has written; cont, if not nil, is waited for before the record.
func previousRequest(pool *pgxpool.Pool, key string, ran, cont chan struct{}) error {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	row := postgres.RowKey(idemserver.ScopedKey("", key))
	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, previousLock("", key)).Scan(&locked); err != nil || !locked {
		return err
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM idemhttp_keys WHERE key = $1 AND expires_at > now()`, row).Scan(&n); err != nil || n > 0 {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO a1_charges (idem_key, amount) VALUES ($1, 1)`, key); err != nil {
		return err
	}
	if ran != nil {
		close(ran)
	}
	if cont != nil {
		<-cont
	}
	var one int
	err = tx.QueryRow(ctx, `
WITH stored AS (
  INSERT INTO idemhttp_keys AS k (key, token, fingerprint, record, expires_at)
  VALUES ($1, 'old', 'fp', '\x01c801', now() + interval '1 day')
  ON CONFLICT (key) DO UPDATE
  SET token = excluded.token, fingerprint = excluded.fingerprint, record = excluded.record, expires_at = excluded.expires_at
  WHERE k.expires_at <= now()
  RETURNING 1)
SELECT 1 / count(*) FROM stored`, row).Scan(&one)
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// TestNewerSchemaRefused: a key table that a newer release laid out (its
// idemhttp_schema row at a version this one does not know) is refused at
// construction, rather than misread. Checked to fail with the version
// check removed: both constructors accepted it.
func TestNewerSchemaRefused(t *testing.T) {
	s := newTxSchema(t)
	pool := s.pool(t, 2)
	_, err := pool.Exec(context.Background(), `UPDATE idemhttp_schema SET version = 2 WHERE component = 'keys'`)
	require.NoError(t, err)
	_, err = postgres.NewStore(context.Background(), pool)
	assert.ErrorIs(t, err, postgres.ErrNewerSchema)
	_, err = postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true})
	assert.ErrorIs(t, err, postgres.ErrNewerSchema)
	require.NoError(t, postgres.Migrate(context.Background(), pool))
	_, err = postgres.NewStore(context.Background(), pool)
	assert.ErrorIs(t, err, postgres.ErrNewerSchema, "Migrate never lowers a version")
}
