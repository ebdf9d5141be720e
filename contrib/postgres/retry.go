package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// retryDelays are the waits before the second and later tries of a
// statement that failed because its connection was gone. The first retry
// is immediate: a pool whose server restarted holds several dead
// connections, each failing at once, and the pool drops each as it fails.
// The later waits cover a server that is still restarting; they add up to
// under half a second, well within a request's patience.
var retryDelays = [...]time.Duration{0, 0, 0, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond}

// retry runs fn until it succeeds, fails in a way that is not retriable,
// tries len(retryDelays)+1 times, or ctx ends. It returns fn's last error.
// Every statement fn runs must be safe to repeat once it has committed
// (see the callers), because a retriable error does not prove beyond doubt
// that it did not.
func retry(ctx context.Context, fn func() error) error {
	err := fn()
	for _, d := range retryDelays {
		if err == nil || !retriable(err) {
			return err
		}
		if d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return errors.Join(err, ctx.Err())
			case <-t.C:
			}
		} else if ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		err = fn()
	}
	return err
}

// retriable reports whether err shows that the statement did not run: pgx
// failed before sending anything (a dead pooled connection, a refused
// connection), or the server ended the session instead of running it
// (pg_terminate_backend, a shutdown or restart, a server still starting).
// A connection lost while a statement ran is not retriable: its outcome is
// unknown, and the caller must say so.
func retriable(err error) bool {
	var connectErr *pgconn.ConnectError
	if pgconn.SafeToRetry(err) || errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		}
	}
	return false
}
