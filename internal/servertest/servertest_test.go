package servertest_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servercore"
	"github.com/idemkit/idemhttp/internal/servermodel"
	"github.com/idemkit/idemhttp/internal/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestMemoryStore(t *testing.T) {
	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		return servertest.Streamed(app, new(idemserver.MemoryStore))
	})
}

// TestModelStore: the modelled store answers as the real ones do.
func TestModelStore(t *testing.T) {
	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		return servertest.Streamed(app, new(servermodel.Store))
	})
}

// TestModelTxServer: the modelled transactional shell answers as
// TxMiddleware does.
func TestModelTxServer(t *testing.T) {
	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		var refuse atomic.Int32
		db := &servermodel.DB{Faults: func(op servermodel.Op, _ string) servermodel.Fault {
			if op == servermodel.OpComplete && refuse.Add(-1) >= 0 {
				return servermodel.Refuse
			}
			return servermodel.Pass
		}}
		s := &servermodel.TxServer{DB: db, MaxStoredBody: app.MaxStoredBody, Handler: modelApp(app)}
		return &servertest.Target{
			Mode:           servercore.Transactional,
			Handler:        s,
			Effects:        func(key string) int { return db.EffectsOf(idemserver.ScopedKey("", key)) },
			RefuseComplete: func(n int) { refuse.Store(int32(n)) },
		}
	})
}

// modelApp maps app's behaviours onto a modelled transaction.
func modelApp(app *servertest.App) func(w http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
	return func(w http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
		run := app.Run(r)
		switch servertest.Do(r) {
		case servertest.DoFail:
			w.WriteHeader(http.StatusInternalServerError)
			return nil
		case servertest.DoPanic:
			panic(http.ErrAbortHandler)
		}
		if err := tx.Effect(run); err != nil {
			return err
		}
		switch servertest.Do(r) {
		case servertest.DoGiveUp:
			app.Started(r)
			<-r.Context().Done()
			return nil
		case servertest.DoHold:
			app.Hold(r)
		case servertest.DoCommitGoOn:
			tx.CommitAndChain()
			app.Hold(r)
		case servertest.DoCommitChain:
			tx.CommitAndChain()
		case servertest.DoCommitAbort:
			tx.CommitAndChain()
			return tx.Fail()
		case servertest.DoBig:
			app.Big(w)
			return nil
		case servertest.DoSwitch:
			servertest.Switch(w)
			return nil
		}
		servertest.Answer(w, run)
		return nil
	}
}
