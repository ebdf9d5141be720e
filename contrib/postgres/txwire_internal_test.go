package postgres

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// The wire against a scripted server: what it does with answers a real
// server sends only when something is wrong (a message out of place, one
// of another protocol, none at all).

// scriptedServer accepts one connection, completes its startup, then for
// each flight (read up to its Sync) sends what answer returns for it.
func scriptedServer(t *testing.T, answer func(flight int) []pgproto3.BackendMessage) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		be := pgproto3.NewBackend(c, c)
		if _, err := be.ReceiveStartupMessage(); err != nil {
			return
		}
		be.Send(&pgproto3.AuthenticationOk{})
		be.Send(&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if be.Flush() != nil {
			return
		}
		for flight := 0; ; flight++ {
			for {
				msg, err := be.Receive()
				if err != nil {
					return
				}
				if _, ok := msg.(*pgproto3.Sync); ok {
					break
				}
				if _, ok := msg.(*pgproto3.Terminate); ok {
					return
				}
			}
			for _, m := range answer(flight) {
				be.Send(m)
			}
			if be.Flush() != nil {
				return
			}
		}
	}()
	return ln.Addr().String()
}

// scriptedWire connects to a scripted server and returns the
// connection's wire.
func scriptedWire(t *testing.T, addr string) (*pgx.Conn, *wireConn) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	conn, err := pgx.Connect(context.Background(), "postgres://u@"+host+":"+port+"/d?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	w := wireFor(conn)
	if w == nil {
		t.Fatal("no wire")
	}
	return conn, w
}

var testStmts = newWireStmts(newKeysSQL("public.idemhttp_keys"), "BEGIN")

// TestWireOutOfStepClosesTheConnection: an answer the flight did not ask
// for (a row, a completion, a parse after the flight's statements, a
// message of another protocol) fails the step and closes the connection,
// whose next answers could not be told from the flight's. Checked to fail
// with exchange ignoring what it does not expect (default case and the
// counts' checks dropped): the step succeeded.
func TestWireOutOfStepClosesTheConnection(t *testing.T) {
	for name, extra := range map[string]pgproto3.BackendMessage{
		"row":        &pgproto3.DataRow{Values: [][]byte{{1}}},
		"completion": &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		"parse":      &pgproto3.ParseComplete{},
		"copy":       &pgproto3.CopyInResponse{},
	} {
		t.Run(name, func(t *testing.T) {
			addr := scriptedServer(t, func(int) []pgproto3.BackendMessage {
				return []pgproto3.BackendMessage{
					&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, &pgproto3.CommandComplete{CommandTag: []byte("BEGIN")},
					extra,
					&pgproto3.ReadyForQuery{TxStatus: 'T'},
				}
			})
			conn, w := scriptedWire(t, addr)
			w.start()
			w.exec(w.bind(testStmts.begin))
			err := w.run(context.Background(), time.Now().Add(5*time.Second))
			var we *wireError
			if !errors.As(err, &we) || we.SafeToRetry() {
				t.Fatalf("step: %v, want a wire error not safe to retry", err)
			}
			if !conn.PgConn().IsClosed() {
				t.Fatal("the connection was kept")
			}
		})
	}
}

// TestWireStatementErrorKeepsTheConnection: a statement's error is the
// statement's (the rest of the flight skipped), the connection kept, in
// step, with the prepared statement not taken for prepared; a stale one
// closes it, and the step may be tried again. Checked to fail with
// exchange recording the error on the flight's last statement whatever
// the statement that failed: the failed one was taken for done.
func TestWireStatementErrorKeepsTheConnection(t *testing.T) {
	addr := scriptedServer(t, func(flight int) []pgproto3.BackendMessage {
		code := "22012"
		if flight == 1 {
			code = "26000"
		}
		return []pgproto3.BackendMessage{
			&pgproto3.ParseComplete{}, &pgproto3.BindComplete{}, &pgproto3.CommandComplete{CommandTag: []byte("BEGIN")},
			&pgproto3.ErrorResponse{Severity: "ERROR", Code: code, Message: "no"},
			&pgproto3.ReadyForQuery{TxStatus: 'E'},
		}
	})
	conn, w := scriptedWire(t, addr)
	for flight := range 2 {
		w.start()
		w.exec(w.bind(testStmts.begin))
		at := w.bind(testStmts.sameTx)
		w.int8(1)
		w.exec(at)
		w.exec(w.bind(testStmts.commit))
		err := w.run(context.Background(), time.Now().Add(5*time.Second))
		if flight == 1 {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "26000" || !pgconn.SafeToRetry(err) || !conn.PgConn().IsClosed() {
				t.Fatalf("stale: %v, closed %v", err, conn.PgConn().IsClosed())
			}
			return
		}
		if err != nil || conn.PgConn().IsClosed() {
			t.Fatalf("flight: %v", err)
		}
		if _, err := w.result(0); err != nil {
			t.Fatalf("BEGIN: %v", err)
		}
		var pgErr *pgconn.PgError
		if _, err := w.result(1); !errors.As(err, &pgErr) || pgErr.Code != "22012" {
			t.Fatalf("sameTx: %v", err)
		}
		if _, err := w.result(2); err == nil {
			t.Fatal("the statement after the error was taken for done")
		}
		if _, ok := w.prepared[testStmts.begin.name]; !ok {
			t.Fatal("the parse answered was not kept")
		}
		if _, ok := w.prepared[testStmts.sameTx.name]; ok {
			t.Fatal("a parse skipped was taken for done")
		}
		if conn.PgConn().TxStatus() != 'E' {
			t.Fatalf("status %c", conn.PgConn().TxStatus())
		}
	}
}

// TestWireSilentServerBoundByTheDeadline: a server that never answers
// fails the step by its deadline, or at once when its context ends, and
// the connection is closed. Checked to fail with run's deadline not set
// on the connection: the step waited for ever (the test's timeout).
func TestWireSilentServerBoundByTheDeadline(t *testing.T) {
	for _, cancelled := range []bool{false, true} {
		addr := scriptedServer(t, func(int) []pgproto3.BackendMessage { return nil })
		conn, w := scriptedWire(t, addr)
		ctx, cancel := context.WithCancel(context.Background())
		deadline := time.Now().Add(200 * time.Millisecond)
		if cancelled {
			deadline = time.Now().Add(time.Hour)
			time.AfterFunc(100*time.Millisecond, cancel)
		}
		w.start()
		w.exec(w.bind(testStmts.begin))
		start := time.Now()
		err := w.run(ctx, deadline)
		cancel()
		if err == nil || pgconn.SafeToRetry(err) || !conn.PgConn().IsClosed() {
			t.Fatalf("cancelled %v: %v, closed %v", cancelled, err, conn.PgConn().IsClosed())
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("cancelled %v: took %v", cancelled, took)
		}
		if cancelled && !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want context.Canceled in it", err)
		}
	}
}

// TestWireTrimsLargeBuffers: a flight that grew the connection's buffers
// past maxKeptBuffer (a large response stored) does not keep them.
// Checked to fail with trim doing nothing.
func TestWireTrimsLargeBuffers(t *testing.T) {
	w := &wireConn{buf: make([]byte, 0, maxKeptBuffer+1), vals: make([]byte, 0, maxKeptBuffer+1)}
	w.trim()
	if w.buf != nil || w.vals != nil {
		t.Fatal("kept")
	}
	w = &wireConn{buf: make([]byte, 0, 1024)}
	w.trim()
	if cap(w.buf) != 1024 {
		t.Fatal("a small buffer dropped")
	}
}
