package postgres_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// keyRows returns how many rows s's key table holds.
func keyRows(t *testing.T, s *testSchema) int {
	t.Helper()
	var n int
	require.NoError(t, s.admin(t).QueryRow(context.Background(), `SELECT count(*) FROM `+s.name+`.idemhttp_keys`).Scan(&n))
	return n
}

// TestTxSearchPathMovesNothing: a handler that moves the search_path to
// another schema (a schema per tenant, SET LOCAL) holding its own key
// table: the record goes to the table the middleware resolved when it
// was made, and a retry replays it (issue 30, §2.2). Checked to fail with
// the statements left unqualified: the record was looked for in the
// tenant's table, the claim was taken for lost (409), and nothing was
// stored.
func TestTxSearchPathMovesNothing(t *testing.T) {
	home, tenant := newTxSchema(t), newSchema(t)
	m := newTx(t, home, 2, &postgres.TxOptions{Logger: discardLogger()})
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), "SET LOCAL search_path TO "+tenant.name+", "+home.name); err != nil {
			return err
		}
		return chargeTx(w, r, tx)
	})
	first := post(t, h, "k", "x")
	require.Equal(t, http.StatusCreated, first.Status, first.Body)
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: first.Body}, post(t, h, "k", "x"))
	assert.Equal(t, 1, keyRows(t, home))
	assert.Equal(t, 0, keyRows(t, tenant), "nothing in the tenant's table")
}

// TestStoreSearchPathMovesNothing: a session SET search_path left on a
// pooled connection (by the application, between requests) does not move
// the Store's records: every statement names the table NewStore found
// (issue 30, §2.2). Checked to fail with the statements left
// unqualified: the record went to the other schema's table.
func TestStoreSearchPathMovesNothing(t *testing.T) {
	home, other := newSchema(t), newSchema(t)
	pool := home.pool(t, 1) // one connection: the one the SET is left on
	store := newStore(t, pool)
	_, err := pool.Exec(context.Background(), "SET search_path TO "+other.name)
	require.NoError(t, err)
	var runs int
	h := (&idemserver.Middleware{Store: store, SingleTenant: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
	}))
	require.Equal(t, http.StatusCreated, post(t, h, "k", "x").Status)
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true}, post(t, h, "k", "x"))
	assert.Equal(t, 1, runs)
	assert.Equal(t, 1, keyRows(t, home))
	assert.Equal(t, 0, keyRows(t, other), "nothing in the other schema's table")
}
