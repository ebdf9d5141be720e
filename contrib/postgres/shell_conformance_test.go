package postgres_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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
// the modelled transactional shell does, on a pool whose connections take
// the wire (TestTxConformanceOtherPools: through pgx.Batch).
func TestTxConformance(t *testing.T) {
	serverURL(t)
	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		s := newTxSchema(t)
		m := newTx(t, s, 20, &postgres.TxOptions{MaxStoredBody: app.MaxStoredBody, Logger: discardLogger()})
		return &servertest.Target{
			Mode:           servercore.Transactional,
			Handler:        m.WrapFunc(txApp(app)),
			Effects:        func(key string) int { return len(charges(t, s, key)) },
			RefuseComplete: refusingStores(t, s),
		}
	})
}

// refusingStores returns the RefuseComplete of a target on s: the
// database refuses the next n statements that write a record into a claim
// row, with disk_full (53100), as a database out of room would: a trigger
// on s's key table. It counts with a sequence, whose nextval stays taken
// when the refused transaction rolls back.
func refusingStores(t *testing.T, s *testSchema) func(n int) {
	t.Helper()
	ctx := context.Background()
	admin := s.admin(t)
	_, err := admin.Exec(ctx, strings.ReplaceAll(`
CREATE SEQUENCE S.refuse_seq;
CREATE TABLE S.refuse_limit (n bigint NOT NULL);
INSERT INTO S.refuse_limit VALUES (0);
CREATE FUNCTION S.refuse_store() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('S.refuse_seq') <= (SELECT n FROM S.refuse_limit) THEN
    RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'disk_full';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_store BEFORE UPDATE ON S.idemhttp_keys FOR EACH ROW
WHEN (OLD.record IS NULL AND NEW.record IS NOT NULL) EXECUTE FUNCTION S.refuse_store();`, "S.", s.name+"."))
	require.NoError(t, err)
	return func(n int) {
		_, err := admin.Exec(ctx, strings.ReplaceAll(`SELECT setval('S.refuse_seq', 1, false)`, "S.", s.name+"."))
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `UPDATE `+s.name+`.refuse_limit SET n = $1`, n)
		require.NoError(t, err)
	}
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
		case servertest.DoCommitGoOn, servertest.DoCommitChain:
			if _, err := tx.Exec(r.Context(), "COMMIT AND CHAIN"); err != nil {
				return err
			}
			if servertest.Do(r) == servertest.DoCommitGoOn {
				app.Hold(r)
			}
		case servertest.DoCommitAbort:
			if _, err := tx.Exec(r.Context(), "COMMIT AND CHAIN"); err != nil {
				return err
			}
			_, err := tx.Exec(r.Context(), "SELECT 1/0")
			return err
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
