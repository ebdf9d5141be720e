package servermodel_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servermodel"
)

// post sends one keyed POST to s and returns its status.
func post(s http.Handler, key, body string) int {
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w.Code
}

// TestDBDrop: a server process that dies mid-handler (its pool dropped)
// leaves nothing of its open transaction: its effects roll back, its
// key's lock is released at once (another process's retry runs), and no
// statement on its connections commits anything afterwards, COMMIT AND
// CHAIN included. (Checked to fail with Drop not ending the pool's
// transactions: the retry got 409; and with CommitAndChain reviving a
// broken transaction: the dead handler's charge committed.)
func TestDBDrop(t *testing.T) {
	db := &servermodel.DB{}
	var afterDrop error
	dying := &servermodel.TxServer{DB: db, Pool: "a", Handler: func(w http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
		require.NoError(t, tx.Effect("first"))
		db.Drop("a") // the process dies here
		tx.CommitAndChain()
		afterDrop = tx.Effect("second")
		tx.Commit()
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	assert.NotEqual(t, http.StatusCreated, post(dying, "k", "x"))
	assert.ErrorIs(t, afterDrop, servermodel.ErrLost)
	assert.Empty(t, db.Effects())
	assert.NotEqual(t, http.StatusCreated, post(dying, "k", "x"), "a dropped pool's new connections fail too")

	other := &servermodel.TxServer{DB: db, Pool: "b", Handler: func(w http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
		require.NoError(t, tx.Effect("retry"))
		w.WriteHeader(http.StatusCreated)
		return nil
	}}
	require.Equal(t, http.StatusCreated, post(other, "k", "x"))
	assert.Equal(t, []servermodel.Effect{{Key: idemserver.ScopedKey("", "k"), Name: "retry"}}, db.Effects())
}

// TestDBWrite: a write outside any transaction commits at once. (Checked
// to fail with Write doing nothing.)
func TestDBWrite(t *testing.T) {
	db := &servermodel.DB{}
	db.Write("k", "charge")
	assert.Equal(t, 1, db.EffectsOf("k"))
}

// TestTxServerFaults: a TxServer's own Faults decide its statements'
// faults, over the DB's. (Checked to fail with the DB's Faults used
// throughout.)
func TestTxServerFaults(t *testing.T) {
	db := &servermodel.DB{Faults: func(servermodel.Op, string) servermodel.Fault { return servermodel.Refuse }}
	charge := func(w http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
		w.WriteHeader(http.StatusCreated)
		return tx.Effect("charge")
	}
	assert.Equal(t, http.StatusServiceUnavailable, post(&servermodel.TxServer{DB: db, Handler: charge}, "k1", "x"))
	own := &servermodel.TxServer{DB: db, Handler: charge, Faults: func(servermodel.Op, string) servermodel.Fault { return servermodel.Pass }}
	assert.Equal(t, http.StatusCreated, post(own, "k2", "x"))
}

// TestTxServerBody: the handler reads the request's body, as
// TxMiddleware's does. (Checked to fail with the body taken away.)
func TestTxServerBody(t *testing.T) {
	var got string
	s := &servermodel.TxServer{DB: &servermodel.DB{}, Handler: func(w http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
		b, err := io.ReadAll(r.Body)
		got = string(b)
		return err
	}}
	require.Equal(t, http.StatusOK, post(s, "k", `{"amount":1}`))
	assert.Equal(t, `{"amount":1}`, got)
}

// TestStoreFull: a call the store refuses for lack of room does nothing,
// and its error wraps idemserver.ErrStoreFull, which the core answers
// 503 with. (Checked to fail with Full doing the call's work.)
func TestStoreFull(t *testing.T) {
	full := true
	s := &servermodel.Store{Faults: func(servermodel.Op, string) servermodel.Fault {
		if full {
			return servermodel.Full
		}
		return servermodel.Pass
	}}
	_, err := s.Claim(context.Background(), "k", idemserver.Claim{Token: "t1", Fingerprint: "fp", LockTimeout: time.Second})
	require.Error(t, err)
	assert.True(t, errors.Is(err, idemserver.ErrStoreFull), "%v", err)
	_, ok := s.Record("k")
	assert.False(t, ok, "a refused claim claimed")
	full = false
	res, err := s.Claim(context.Background(), "k", idemserver.Claim{Token: "t2", Fingerprint: "fp", LockTimeout: time.Second})
	require.NoError(t, err)
	assert.Equal(t, idemserver.Claimed, res.State)
}
