package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// a1ChargesDDL is the business table of the transactional tests. Its
// idem_key column is deliberately not UNIQUE: the tests count rows per key
// to check that the middleware alone lets one run commit.
const a1ChargesDDL = `CREATE TABLE a1_charges (
    id bigserial PRIMARY KEY, idem_key text NOT NULL, amount integer NOT NULL)`

// newTxSchema is newSchema plus the a1_charges table.
func newTxSchema(t testing.TB) *testSchema {
	t.Helper()
	s := newSchema(t)
	_, err := s.pool(t, 1).Exec(context.Background(), a1ChargesDDL)
	require.NoError(t, err)
	return s
}

// chargeTx inserts a charge for the request's key and answers 201 with
// its id. Outside TxMiddleware (the split server of TestTxCrash) it reads
// the key from the header.
func chargeTx(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	k, ok := postgres.KeyFromContext(r.Context())
	if !ok {
		k.Key = r.Header.Get("Idempotency-Key")
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	var id int64
	err = tx.QueryRow(r.Context(), `INSERT INTO a1_charges (idem_key, amount) VALUES ($1, $2) RETURNING id`,
		k.Key, len(body)).Scan(&id)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, err = fmt.Fprintf(w, `{"id":%d}`, id)
	return err
}

// charges returns the ids of the charges committed for key.
func charges(t testing.TB, s *testSchema, key string) []int64 {
	t.Helper()
	rows, err := s.pool(t, 1).Query(context.Background(), `SELECT id FROM a1_charges WHERE idem_key = $1 ORDER BY id`, key)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

func newTx(t testing.TB, s *testSchema, conns int32, opts *postgres.TxOptions) *postgres.TxMiddleware {
	t.Helper()
	if opts == nil {
		opts = &postgres.TxOptions{}
	}
	if opts.Principal == nil {
		opts.SingleTenant = true
	}
	m, err := postgres.NewTxMiddleware(context.Background(), s.pool(t, conns), opts)
	require.NoError(t, err)
	return m
}

// reply is what a test client saw.
type reply struct {
	Status   int
	Replayed bool
	Body     string
}

func post(t testing.TB, h http.Handler, key, body string) reply {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return reply{Status: rec.Code, Replayed: rec.Header().Get(idemserver.ReplayedHeader) == "true", Body: rec.Body.String()}
}

func TestTxStoresWithTheWrite(t *testing.T) {
	s := newTxSchema(t)
	h := newTx(t, s, 4, nil).WrapFunc(chargeTx)

	first := post(t, h, "k1", "amount=1")
	require.Equal(t, http.StatusCreated, first.Status)
	assert.False(t, first.Replayed)
	ids := charges(t, s, "k1")
	require.Len(t, ids, 1)
	assert.Equal(t, fmt.Sprintf(`{"id":%d}`, ids[0]), first.Body)

	again := post(t, h, "k1", "amount=1")
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: first.Body}, again)
	assert.Len(t, charges(t, s, "k1"), 1)

	other := post(t, h, "k1", "amount=2")
	assert.Equal(t, http.StatusUnprocessableEntity, other.Status)
	assert.Contains(t, other.Body, idemserver.TypeKeyMismatch)
	assert.Len(t, charges(t, s, "k1"), 1)
}

// TestTxNotCommitted checks every path that must commit nothing and free
// the key: a handler error, a 5xx, a status that is not stored, a response
// too large to store. A retry then runs again, and commits.
func TestTxNotCommitted(t *testing.T) {
	tests := []struct {
		name       string
		give       func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error
		wantStatus int
		wantBody   string
	}{
		{"error", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(w, r, tx)
			return errors.New("card declined by the bank's mainframe")
		}, http.StatusInternalServerError, postgres.TypeRolledBack},
		{"5xx", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(httptest.NewRecorder(), r, tx)
			w.WriteHeader(http.StatusBadGateway)
			return nil
		}, http.StatusBadGateway, ""},
		{"409 not stored", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(httptest.NewRecorder(), r, tx)
			w.WriteHeader(http.StatusConflict)
			return nil
		}, http.StatusConflict, ""},
		{"failed statement ignored", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(httptest.NewRecorder(), r, tx)
			_, _ = tx.Exec(r.Context(), `SELECT 1 / 0`) // aborts the transaction
			w.WriteHeader(http.StatusCreated)
			return nil
		}, http.StatusInternalServerError, postgres.TypeRolledBack},
		{"too large", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(httptest.NewRecorder(), r, tx)
			_, _ = w.Write(make([]byte, 2048))
			return nil
		}, http.StatusInternalServerError, postgres.TypeResponseTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTxSchema(t)
			m := newTx(t, s, 2, &postgres.TxOptions{MaxStoredBody: 1024, Logger: discardLogger()})
			got := post(t, m.WrapFunc(tt.give), "k", "x")
			assert.Equal(t, tt.wantStatus, got.Status)
			assert.Contains(t, got.Body, tt.wantBody)
			assert.NotContains(t, got.Body, "mainframe", "a handler's error text never reaches the client")
			assert.Empty(t, charges(t, s, "k"))

			got = post(t, m.WrapFunc(chargeTx), "k", "x")
			assert.Equal(t, http.StatusCreated, got.Status)
			assert.False(t, got.Replayed)
			assert.Len(t, charges(t, s, "k"), 1)
		})
	}
}

// TestTxPanic: a panic rolls back, frees the key, and continues.
func TestTxPanic(t *testing.T) {
	s := newTxSchema(t)
	m := newTx(t, s, 2, nil)
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		_ = chargeTx(w, r, tx)
		panic("boom")
	})
	assert.PanicsWithValue(t, "boom", func() { post(t, h, "k", "x") })
	assert.Empty(t, charges(t, s, "k"))
	assert.Equal(t, http.StatusCreated, post(t, m.WrapFunc(chargeTx), "k", "x").Status)
}

// TestTxStoreClaimWaits has a Store sharing the table claim the key while
// a TxMiddleware request with the same key runs: the Store's claim finds
// the key's advisory lock taken and answers in progress at once, without
// waiting for the request's transaction (it once did, for as long as the
// handler ran: TestStoreClaimWaitsForARunningTxHandler); once the request
// has committed, a claim finds the stored response. Exactly one runs.
// (Checked to fail with the claim row written already expired: the
// Store's claim took the key over once the request committed.)
func TestTxStoreClaimWaits(t *testing.T) {
	ctx := context.Background()
	s := newTxSchema(t)
	m := newTx(t, s, 2, &postgres.TxOptions{Logger: discardLogger()})
	entered := make(chan struct{})
	release := make(chan struct{})
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		close(entered)
		<-release
		return chargeTx(w, r, tx)
	})
	replies := make(chan reply, 1)
	go func() { replies <- post(t, h, "k", "x") }()
	<-entered
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("x"))
	store := newStore(t, s.pool(t, 1))
	claim := func() idemserver.ClaimResult {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // it once waited for the request
		defer cancel()
		res, err := store.Claim(ctx, idemserver.ScopedKey("", "k"),
			idemserver.Claim{Token: "other", Fingerprint: idemserver.DefaultFingerprint(req, []byte("x")), LockTimeout: time.Minute})
		assert.NoError(t, err)
		return res
	}
	assert.Equal(t, idemserver.InProgress, claim().State, "the request runs")
	close(release)
	got := <-replies
	assert.Equal(t, http.StatusCreated, got.Status)
	assert.Equal(t, idemserver.Completed, claim().State, "the Store finds the response")
	assert.Len(t, charges(t, s, "k"), 1)
}

// TestTxClaimLost: a handler that deletes its own claim row (so that the
// response has no row to go into) commits nothing: the guarded store
// refuses, and the business write rolls back with it. Checked to fail
// with the guard's "1 / count(*)" replaced by "1": the charge then
// committed without its record.
func TestTxClaimLost(t *testing.T) {
	s := newTxSchema(t)
	m := newTx(t, s, 2, &postgres.TxOptions{Logger: discardLogger()})
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `DELETE FROM idemhttp_keys`); err != nil {
			return err
		}
		return chargeTx(w, r, tx)
	})
	got := post(t, h, "k", "x")
	assert.Equal(t, http.StatusConflict, got.Status)
	assert.Contains(t, got.Body, idemserver.TypeInProgress)
	assert.Empty(t, charges(t, s, "k"), "the business write must roll back with the lost claim")
}

func TestTxKeyFromContext(t *testing.T) {
	s := newTxSchema(t)
	m := newTx(t, s, 2, &postgres.TxOptions{Principal: func(r *http.Request) string { return r.Header.Get("X-Account") }})
	keys := make(chan postgres.TxKey, 2)
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		k, ok := postgres.KeyFromContext(r.Context())
		if ok {
			keys <- k
		}
		return nil
	})
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set("Idempotency-Key", "k-42")
	req.Header.Set("X-Account", "acct_1")
	h.ServeHTTP(httptest.NewRecorder(), req)
	k := <-keys
	assert.Equal(t, "k-42", k.Key)
	assert.Equal(t, "acct_1", k.Scope)
	assert.NotEmpty(t, k.Token)

	secret := []byte("0123456789abcdef0123456789abcdef")
	d1, err := k.DeriveKey(secret, "charge")
	require.NoError(t, err)
	d2, err := postgres.TxKey{Key: "k-42", Scope: "acct_1", Token: "other run"}.DeriveKey(secret, "charge")
	require.NoError(t, err)
	assert.Equal(t, d1, d2, "a run again after a crash derives the same key")
	d3, err := postgres.TxKey{Key: "k-42", Scope: "acct_2"}.DeriveKey(secret, "charge")
	require.NoError(t, err)
	assert.NotEqual(t, d1, d3)

	// A request without a key runs in a transaction of its own, committed.
	_, ok := postgres.KeyFromContext(context.Background())
	assert.False(t, ok)
	got := post(t, m.WrapFunc(chargeTx), "", "x")
	assert.Equal(t, http.StatusCreated, got.Status)
	assert.Len(t, charges(t, s, ""), 1)
	assert.Empty(t, keys)
}

// TestTxLongScope: a principal's scope far beyond the index limit is
// stored under its hash, not refused.
func TestTxLongScope(t *testing.T) {
	s := newTxSchema(t)
	long := randomHex(3000) // incompressible: a repeated string compresses below the limit
	m := newTx(t, s, 2, &postgres.TxOptions{Principal: func(*http.Request) string { return long }})
	h := m.WrapFunc(chargeTx)
	first := post(t, h, "k", "x")
	require.Equal(t, http.StatusCreated, first.Status)
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: first.Body}, post(t, h, "k", "x"))
	var n int
	require.NoError(t, s.pool(t, 1).QueryRow(context.Background(),
		`SELECT count(*) FROM idemhttp_keys WHERE key = $1`, postgres.RowKey(idemserver.ScopedKey(long, "k"))).Scan(&n))
	assert.Equal(t, 1, n)
}

// TestStoreLongKey is the same for the Store. Checked to fail with rowKey
// returning keys unhashed: every Claim of such a key (this test's, and
// TestTxLongScope's) failed with "index row size 6016 exceeds btree
// version 4 maximum 2704", a permanent 503 for that client.
func TestStoreLongKey(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, newSchema(t).pool(t, 0))
	long := randomHex(3000) // incompressible, as in TestTxLongScope
	c := idemserver.Claim{Token: "t1", Fingerprint: "fp", LockTimeout: time.Minute}
	res, err := store.Claim(ctx, long, c)
	require.NoError(t, err)
	assert.Equal(t, idemserver.Claimed, res.State)
	require.NoError(t, store.Complete(ctx, long, "t1", []byte("r"), time.Minute))
	res, err = store.Claim(ctx, long, idemserver.Claim{Token: "t2", Fingerprint: "fp", LockTimeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, idemserver.Completed, res.State)
	// The hashed form cannot be claimed by a key that spells it out.
	res, err = store.Claim(ctx, string(postgres.RowKey(long)), idemserver.Claim{Token: "t3", Fingerprint: "fp", LockTimeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, idemserver.Claimed, res.State)
}

func TestRowKey(t *testing.T) {
	tests := []struct {
		give       string
		wantHashed bool
	}{
		{give: "k", wantHashed: false},
		{give: strings.Repeat("a", 200), wantHashed: false},
		{give: strings.Repeat("a", 201), wantHashed: true},
		{give: "sha256:abc", wantHashed: true},
	}
	for _, tt := range tests {
		got := string(postgres.RowKey(tt.give))
		assert.Equal(t, tt.wantHashed, strings.HasPrefix(got, "sha256:"), tt.give)
		assert.LessOrEqual(t, len(got), 200)
	}
}

// TestTxConcurrentDuplicates sends 200 requests with one key at once while
// the first holds its claim: exactly one runs and commits; the others get
// 409 at once (the key's advisory lock is taken), and afterwards every
// retry gets the stored response. It also reports the connections the
// waiting duplicates held (sessions waiting on a lock, sampled).
func TestTxConcurrentDuplicates(t *testing.T) {
	const n = 200
	s := newTxSchema(t)
	m := newTx(t, s, 16, nil)
	entered := make(chan struct{}, n)
	release := make(chan struct{})
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		entered <- struct{}{}
		<-release
		return chargeTx(w, r, tx)
	})
	replies := make(chan reply, n)
	go func() { replies <- post(t, h, "dup", "x") }()
	<-entered
	stop, peak := sampleLockWaiters(t, s)
	began := time.Now()
	var wg sync.WaitGroup
	for range n - 1 {
		wg.Go(func() { replies <- post(t, h, "dup", "x") })
	}
	wg.Wait()
	took := time.Since(began)
	stop()
	close(release)
	counts := map[int]int{}
	var created reply
	for range n {
		got := <-replies
		counts[got.Status]++
		if got.Status == http.StatusCreated {
			created = got
		}
	}
	assert.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusConflict: n - 1}, counts)
	assert.Len(t, entered, 0, "no duplicate ran the handler")
	ids := charges(t, s, "dup")
	require.Len(t, ids, 1)
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: created.Body}, post(t, h, "dup", "x"))
	t.Logf("uncommitted claim: %d duplicates answered in %v; peak %d sessions waiting on the key's lock (pool of 16)",
		n-1, took.Round(time.Millisecond), *peak)
}

// TestCommittedClaimDuplicates is the same race against the other design,
// a claim committed on its own (Store.Claim), for the numbers in the
// package README: duplicates never wait on a lock.
func TestCommittedClaimDuplicates(t *testing.T) {
	const n = 200
	ctx := context.Background()
	s := newSchema(t)
	store := newStore(t, s.pool(t, 16))
	res, err := store.Claim(ctx, "dup", idemserver.Claim{Token: "first", Fingerprint: "fp", LockTimeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, idemserver.Claimed, res.State)
	stop, peak := sampleLockWaiters(t, s)
	began := time.Now()
	states := make(chan idemserver.ClaimState, n-1)
	var wg sync.WaitGroup
	for i := range n - 1 {
		wg.Go(func() {
			res, err := store.Claim(ctx, "dup", idemserver.Claim{Token: fmt.Sprint("dup-", i), Fingerprint: "fp", LockTimeout: time.Minute})
			if err != nil {
				res.State = 0
			}
			states <- res.State
		})
	}
	wg.Wait()
	took := time.Since(began)
	stop()
	for range n - 1 {
		assert.Equal(t, idemserver.InProgress, <-states)
	}
	t.Logf("committed claim: %d duplicates answered in %v; peak %d sessions waiting on a lock (pool of 16)",
		n-1, took.Round(time.Millisecond), *peak)
}

// TestTxSlowHandler holds a handler for half a second, longer than the
// lock timeout this test would give a committed claim: duplicates
// meanwhile get 409, the slow run commits, and it is the only one.
func TestTxSlowHandler(t *testing.T) {
	s := newTxSchema(t)
	m := newTx(t, s, 4, nil)
	entered := make(chan struct{}, 8)
	release := make(chan struct{})
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		entered <- struct{}{}
		<-release
		return chargeTx(w, r, tx)
	})
	first := make(chan reply, 1)
	go func() { first <- post(t, h, "slow", "x") }()
	<-entered
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for start := time.Now(); time.Since(start) < 500*time.Millisecond; <-tick.C {
		assert.Equal(t, http.StatusConflict, post(t, h, "slow", "x").Status)
	}
	close(release)
	got := <-first
	assert.Equal(t, http.StatusCreated, got.Status)
	assert.Len(t, charges(t, s, "slow"), 1)
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: got.Body}, post(t, h, "slow", "x"))
	assert.Len(t, entered, 0)
}

// sampleLockWaiters counts, until stop, the schema's sessions waiting on a
// lock, and keeps the peak.
func sampleLockWaiters(t testing.TB, s *testSchema) (stop func(), peak *int) {
	conn := s.admin(t)
	done := make(chan struct{})
	finished := make(chan struct{})
	peak = new(int)
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			default:
			}
			var n int
			err := conn.QueryRow(context.Background(), `
SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, s.name).Scan(&n)
			if err != nil {
				return
			}
			*peak = max(*peak, n)
		}
	}()
	return func() { close(done); <-finished }, peak
}

// fakeStandby answers pg_is_in_recovery() with true.
type fakeStandby struct{ postgres.DB }

func (fakeStandby) QueryRow(context.Context, string, ...any) pgx.Row { return trueRow{} }

type trueRow struct{}

func (trueRow) Scan(dest ...any) error { *dest[0].(*bool) = true; return nil }

func TestTxRefusesStandby(t *testing.T) {
	_, err := postgres.NewTxMiddleware(context.Background(), fakeStandby{}, &postgres.TxOptions{SingleTenant: true})
	assert.ErrorIs(t, err, postgres.ErrStandby)
	assert.ErrorIs(t, postgres.CheckPrimary(context.Background(), fakeStandby{}), postgres.ErrStandby)

	s := newSchema(t)
	assert.NoError(t, postgres.CheckPrimary(context.Background(), s.pool(t, 1)))
	_, err = postgres.NewTxMiddleware(context.Background(), s.pool(t, 1), nil)
	assert.ErrorContains(t, err, "Principal", "a nil Principal needs SingleTenant")
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// plainDB hides the pool's Acquire, so that TxMiddleware takes its path
// for other DBs: the response and COMMIT in round trips of their own.
type plainDB struct{ postgres.DB }

func TestTxWithoutAcquire(t *testing.T) {
	s := newTxSchema(t)
	m, err := postgres.NewTxMiddleware(context.Background(), plainDB{s.pool(t, 4)}, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
	require.NoError(t, err)
	h := m.WrapFunc(chargeTx)
	first := post(t, h, "k1", "x")
	require.Equal(t, http.StatusCreated, first.Status)
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: first.Body}, post(t, h, "k1", "x"))
	assert.Len(t, charges(t, s, "k1"), 1)

	// The claim row goes from under the running handler (here through
	// its own transaction): nothing commits.
	lost := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		_, err := tx.Exec(r.Context(), `DELETE FROM idemhttp_keys WHERE key = $1`, postgres.RowKey(idemserver.ScopedKey("", "k2")))
		if err != nil {
			return err
		}
		return chargeTx(w, r, tx)
	})
	assert.Equal(t, http.StatusConflict, post(t, lost, "k2", "x").Status)
	assert.Empty(t, charges(t, s, "k2"))
	assert.Equal(t, http.StatusInternalServerError, post(t, m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		_ = chargeTx(w, r, tx)
		return errors.New("failed")
	}), "k3", "x").Status)
	assert.Empty(t, charges(t, s, "k3"))
}

// TestTxHandlerOwnsNoCommit: the handler cannot commit or roll back the
// middleware's transaction (committing would split the write from its
// record), and a transaction it keeps after returning is closed.
func TestTxHandlerOwnsNoCommit(t *testing.T) {
	s := newTxSchema(t)
	m := newTx(t, s, 2, nil)
	kept := make(chan pgx.Tx, 1)
	errs := make(chan error, 2)
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if err := chargeTx(w, r, tx); err != nil {
			return err
		}
		errs <- tx.Commit(r.Context())
		errs <- tx.Rollback(r.Context())
		kept <- tx
		return nil
	})
	require.Equal(t, http.StatusCreated, post(t, h, "k", "x").Status)
	assert.ErrorContains(t, <-errs, "TxMiddleware commits")
	assert.ErrorContains(t, <-errs, "TxMiddleware commits")
	tx := <-kept
	_, err := tx.Exec(context.Background(), `INSERT INTO a1_charges (idem_key, amount) VALUES ('late', 1)`)
	assert.ErrorIs(t, err, pgx.ErrTxClosed)
	assert.ErrorIs(t, tx.QueryRow(context.Background(), `SELECT 1`).Scan(new(int)), pgx.ErrTxClosed)
	assert.Empty(t, charges(t, s, "late"))
	assert.Len(t, charges(t, s, "k"), 1)
}

// TestTxIdleTimeout: with IdleTimeout, PostgreSQL ends a transaction left
// idle longer (as a vanished server's would be), which rolls it back and
// frees the key.
func TestTxIdleTimeout(t *testing.T) {
	const idle = 200 * time.Millisecond
	s := newTxSchema(t)
	m := newTx(t, s, 2, &postgres.TxOptions{IdleTimeout: idle, Logger: discardLogger()})
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `SELECT 1`); err != nil {
			return err
		}
		timer := time.NewTimer(5 * idle) // idle in the transaction, past the timeout
		defer timer.Stop()
		<-timer.C
		return chargeTx(w, r, tx)
	})
	got := post(t, h, "k", "x")
	assert.Equal(t, http.StatusInternalServerError, got.Status)
	assert.Contains(t, got.Body, postgres.TypeRolledBack)
	assert.Empty(t, charges(t, s, "k"))
	assert.Equal(t, http.StatusCreated, post(t, m.WrapFunc(chargeTx), "k", "x").Status, "the key is free")
}

// TestTxSharesTheStoresTable: a key a Store holds (claimed, not yet
// completed) answers 409 for the same request and 422 for another, as
// idemserver.Middleware would.
func TestTxSharesTheStoresTable(t *testing.T) {
	ctx := context.Background()
	s := newTxSchema(t)
	h := newTx(t, s, 2, nil).WrapFunc(chargeTx)
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("x"))
	_, err := newStore(t, s.pool(t, 1)).Claim(ctx, idemserver.ScopedKey("", "k"),
		idemserver.Claim{Token: "other", Fingerprint: idemserver.DefaultFingerprint(req, []byte("x")), LockTimeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, http.StatusConflict, post(t, h, "k", "x").Status)
	assert.Equal(t, http.StatusUnprocessableEntity, post(t, h, "k", "y").Status)
	assert.Empty(t, charges(t, s, "k"))
}
