package postgres_test

import (
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/internal/servercore"
	"github.com/idemkit/idemhttp/internal/servertest"
)

// TestMiddlewareConformance: idemserver.Middleware on the PostgreSQL
// Store answers the shell suite's scenarios as the models do.
func TestMiddlewareConformance(t *testing.T) {
	serverURL(t)
	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		return servertest.Streamed(app, newStore(t, newSchema(t).pool(t, 20)))
	})
}

// TestTxConformance: TxMiddleware answers the shell suite's scenarios as
// the modelled transactional shell does.
func TestTxConformance(t *testing.T) {
	serverURL(t)
	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		s := newTxSchema(t)
		m := newTx(t, s, 20, &postgres.TxOptions{MaxStoredBody: app.MaxStoredBody, Logger: discardLogger()})
		return &servertest.Target{
			Mode:    servercore.Transactional,
			Handler: m.WrapFunc(txApp(app)),
			Effects: func(key string) int { return len(charges(t, s, key)) },
		}
	})
}

// txApp maps app's behaviours onto the request's transaction: an effect
// is a charge row.
func txApp(app *servertest.App) func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	return func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		run := app.Run(r)
		switch servertest.Do(r) {
		case servertest.DoFail:
			w.WriteHeader(http.StatusInternalServerError)
			return nil
		case servertest.DoPanic:
			panic(http.ErrAbortHandler)
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO a1_charges (idem_key, amount) VALUES ($1, 1)`, servertest.Key(r)); err != nil {
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
			if _, err := tx.Exec(r.Context(), "COMMIT AND CHAIN"); err != nil {
				return err
			}
			app.Hold(r)
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
