package postgres_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
)

// TestRecoveryPoints runs a two-phase handler: phase one calls another
// service (here a function that counts calls per key, as a server
// honouring idempotency keys would run them) and saves its answer as a
// recovery point; phase two writes the charge. The first run fails after
// phase one, which rolls its transaction back; the retry resumes from the
// recovery point instead of calling again, commits, and clears the point.
func TestRecoveryPoints(t *testing.T) {
	ctx := context.Background()
	s := newTxSchema(t)
	pool := s.pool(t, 4)
	m := newTx(t, s, 4, &postgres.TxOptions{Logger: discardLogger()})
	secret := []byte("0123456789abcdef0123456789abcdef")

	var mu sync.Mutex
	calls := map[string]int{} // the other service's runs, by key
	failOnce := true
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		k, _ := postgres.KeyFromContext(r.Context())
		paid, ok, err := postgres.LoadRecoveryPoint(r.Context(), tx, k, "paid")
		if err != nil {
			return err
		}
		if !ok {
			key, err := k.DeriveKey(secret, "pay")
			if err != nil {
				return err
			}
			mu.Lock()
			calls[key]++
			mu.Unlock()
			paid = []byte("payment-for-" + k.Key)
			if err := postgres.SaveRecoveryPoint(r.Context(), pool, k, "paid", paid); err != nil {
				return err
			}
		}
		if string(paid) != "payment-for-"+k.Key {
			return errors.New("lost the recovery point's data")
		}
		if failOnce {
			failOnce = false
			return errors.New("crashed after paying")
		}
		if err := postgres.ClearRecoveryPoints(r.Context(), tx, k); err != nil {
			return err
		}
		return chargeTx(w, r, tx)
	})

	assert.Equal(t, http.StatusInternalServerError, post(t, h, "k", "x").Status)
	assert.Empty(t, charges(t, s, "k"))
	got := post(t, h, "k", "x")
	assert.Equal(t, http.StatusCreated, got.Status)
	assert.Len(t, charges(t, s, "k"), 1)
	assert.Len(t, calls, 1)
	for _, n := range calls {
		assert.Equal(t, 1, n, "the other service was called once")
	}
	_, ok, err := postgres.LoadRecoveryPoint(ctx, pool, postgres.TxKey{Key: "k"}, "paid")
	require.NoError(t, err)
	assert.False(t, ok, "cleared with the response")

	require.NoError(t, postgres.SaveRecoveryPoint(ctx, pool, postgres.TxKey{Key: "abandoned"}, "paid", nil))
	n, err := postgres.PruneRecoveryPoints(ctx, pool, 0)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
}

// TestRecoveryPointOfThePreviousRelease: a point saved before points were
// the request's (under the scoped key alone, as the previous release
// saved them) is still found by the key's next run, and cleared with the
// response: a retry after the upgrade resumes from it rather than calling
// the other service again. Checked to fail with LoadRecoveryPoint reading
// the request's key only: the handler started over.
func TestRecoveryPointOfThePreviousRelease(t *testing.T) {
	ctx := context.Background()
	s := newTxSchema(t)
	pool := s.pool(t, 4)
	m := newTx(t, s, 4, &postgres.TxOptions{Logger: discardLogger()})
	// As 2d053bb's SaveRecoveryPoint wrote it: the scoped key of a
	// single-tenant request ("0::" and the key) as the row's key.
	_, err := pool.Exec(ctx, `INSERT INTO idemhttp_recovery (key, step, data) VALUES ($1, 'charged', 'ch_old')`, []byte("0::k-old"))
	require.NoError(t, err)
	var resumed []string
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		k, _ := postgres.KeyFromContext(r.Context())
		data, ok, err := postgres.LoadRecoveryPoint(r.Context(), tx, k, "charged")
		if err != nil {
			return err
		}
		if ok {
			resumed = append(resumed, string(data))
		}
		if err := postgres.ClearRecoveryPoints(r.Context(), tx, k); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	})
	require.Equal(t, http.StatusCreated, post(t, h, "k-old", "x").Status)
	assert.Equal(t, []string{"ch_old"}, resumed)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemhttp_recovery`).Scan(&n))
	assert.Zero(t, n, "cleared with the response")
}
