package servermodel_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servercore"
	"github.com/idemkit/idemhttp/internal/servermodel"
)

// TestTxServerUnderFaults drives the transactional core over the
// modelled database through random faults (any statement of the shell
// refused, hung until its bound, or its answer lost) and random handlers
// (a charge, a 5xx, a handler that commits and goes on, one that leaves
// its transaction aborted, one whose client leaves, one that panics), a
// seed per world, and checks what effectively-once means there: no key
// commits more than one effect; a 2xx the handler made (not a replay) was
// committed; a replay is of an effect that committed; and the core never
// made a move its table refuses. A failure prints its seed. (Checked to
// fail with the model's claim taking over a claim row in progress, as
// when only the transaction's lock held the key: a retry after a handler
// that committed itself charged again.)
func TestTxServerUnderFaults(t *testing.T) {
	before := servercore.Refused()
	for seed := uint64(1); seed <= 300; seed++ {
		rnd := rand.New(rand.NewPCG(seed, 0))
		db := &servermodel.DB{Faults: func(servermodel.Op, string) servermodel.Fault {
			if rnd.IntN(8) > 0 {
				return servermodel.Pass
			}
			return servermodel.Fault(1 + rnd.IntN(3))
		}}
		s := &servermodel.TxServer{DB: db, Timeout: time.Millisecond, Handler: faultyApp}
		for i := range 40 {
			key := fmt.Sprint("k", rnd.IntN(3))
			do := []string{"charge", "charge", "charge", "fail", "commit", "commit-go-on", "abort", "give-up", "panic"}[rnd.IntN(9)]
			code, body, replayed := serveModel(s, key, do)
			effects := db.EffectsOf(idemserver.ScopedKey("", key))
			require.LessOrEqual(t, effects, 1, "seed %d, request %d: key %s committed %d effects", seed, i, key, effects)
			if code == http.StatusCreated {
				require.Equal(t, 1, effects, "seed %d, request %d (%s, replayed %v): a 201 with no committed effect: %s", seed, i, do, replayed, body)
			}
		}
	}
	require.Equal(t, before, servercore.Refused(), "the core made a move its table refuses")
}

// faultyApp is the handler of TestTxServerUnderFaults; X-Do says what it
// does.
func faultyApp(w http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
	switch r.Header.Get("X-Do") {
	case "fail":
		w.WriteHeader(http.StatusInternalServerError)
		return nil
	case "panic":
		panic(http.ErrAbortHandler)
	case "abort":
		if err := tx.Effect("charge"); err != nil {
			return err
		}
		_ = tx.Fail()
		w.WriteHeader(http.StatusCreated)
		return nil
	}
	if err := tx.Effect("charge"); err != nil {
		return err
	}
	switch r.Header.Get("X-Do") {
	case "commit":
		tx.Commit()
	case "commit-go-on":
		tx.CommitAndChain()
	case "give-up":
		<-r.Context().Done()
		return nil
	}
	w.WriteHeader(http.StatusCreated)
	return nil
}

// serveModel sends one request to s; give-up's client leaves at once.
func serveModel(s http.Handler, key, do string) (code int, body string, replayed bool) {
	ctx := context.Background()
	if do == "give-up" {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		cancel()
	}
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("x")).WithContext(ctx)
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-Do", do)
	w := httptest.NewRecorder()
	func() {
		defer func() {
			if p := recover(); p != nil && !errors.Is(p.(error), http.ErrAbortHandler) {
				panic(p)
			}
		}()
		s.ServeHTTP(w, r)
	}()
	return w.Code, w.Body.String(), w.Header().Get(idemserver.ReplayedHeader) == "true"
}
