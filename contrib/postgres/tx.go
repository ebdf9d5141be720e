package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servercore"
)

// Problem types of [TxMiddleware]'s own answers, besides idemserver's.
const (
	// TypeRolledBack: 500, the handler returned an error, or the commit
	// failed: nothing was committed and the key is free, so a retry with
	// the same key runs the request again.
	TypeRolledBack = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeRolledBack"
	// TypeResponseTooLarge: 500, the handler's response is larger than
	// [TxOptions.MaxStoredBody], so it could not be stored with the
	// business write: nothing was committed and the key is free.
	TypeResponseTooLarge = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeResponseTooLarge"
	// TypeTxEnded: 500, the handler ended the middleware's transaction
	// itself (a COMMIT or ROLLBACK sent through the transaction or its
	// connection), so its response was neither stored nor sent. What it
	// committed is unknown to the middleware, so the key is kept as
	// completed, not replayable: a retry gets 410
	// ([idemserver.TypeNotReplayable]) and never runs again. The fix is
	// the handler's: return an error to roll back, nil to commit.
	TypeTxEnded = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeTxEnded"
	// TypeSerializationFailure: 503, the request's transaction was rolled
	// back by a serialization failure or a deadlock (SQLSTATE 40001 or
	// 40P01), because of other transactions running at the same time:
	// nothing was committed and the key is free, so a retry with the same
	// key after Retry-After runs the request again. See
	// [TxOptions].SerializationRetries to have the middleware run it again
	// itself.
	TypeSerializationFailure = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeSerializationFailure"
)

// ErrStandby is returned by [NewTxMiddleware] and [CheckPrimary] when the
// database is a standby (pg_is_in_recovery() is true): claims and stored
// responses must be written to, and read from, the primary.
var ErrStandby = errors.New("idemhttp/postgres: the database is a standby, not the primary")

// errNoPrincipal is the error reported to Hooks.OnRefused for a request
// whose Principal returned an empty scope.
var errNoPrincipal = errors.New("idemhttp/postgres: Principal returned an empty scope")

// TxHandler serves a request inside the database transaction that
// [TxMiddleware] commits together with the request's stored response. It
// writes its business rows with tx, writes its response to w, and returns
// nil; returning an error rolls the transaction back. tx's Commit and
// Rollback refuse with an error: the middleware commits, with the stored
// response. A statement that failed aborts the transaction even if the
// handler ignores the error: nothing commits, and the client gets 500
// ([TypeRolledBack]). A handler that ends the transaction itself anyway
// (a COMMIT or ROLLBACK sent with tx.Exec or through tx.Conn()) gets 500
// ([TypeTxEnded]) and its key is kept, never replayed nor run again: see
// [TxMiddleware].
//
// w buffers the response until the transaction has committed: Flush does
// nothing, Hijack is not offered, and 1xx responses are dropped, but for
// 101 Switching Protocols, which rolls the transaction back (500,
// [TypeRolledBack]): a switch of protocols cannot wait for the commit.
type TxHandler interface {
	ServeHTTPTx(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error
}

// TxHandlerFunc lets an ordinary function be a [TxHandler].
type TxHandlerFunc func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error

// ServeHTTPTx calls f(w, r, tx).
func (f TxHandlerFunc) ServeHTTPTx(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	return f(w, r, tx)
}

// TxOptions configures [NewTxMiddleware]. The fields that [idemserver.Middleware]
// also has mean the same there and here.
type TxOptions struct {
	// Principal returns the scope of a request's keys (the tenant or
	// account that sent it), so that one principal can never replay,
	// block or probe another's response. It is required unless
	// SingleTenant is set. A keyed request for which it returns "" is
	// refused with 500 ([idemserver.TypeNoPrincipal]) and runs nothing:
	// every such caller would otherwise share one key space.
	Principal func(r *http.Request) string

	// SingleTenant declares that one party uses the server, so that all
	// requests share one key space; Principal must then be nil. Without
	// it, a nil Principal is refused: a multi-tenant API must not ship
	// with one shared key space by accident.
	SingleTenant bool

	// Methods lists the methods that take idempotency keys; nil means
	// POST and PATCH. Requests with other methods, and keyless requests
	// unless Required, run in a transaction of their own without a key.
	Methods []string

	// Required makes the key mandatory for Methods (400 without one).
	Required bool

	// KeyHeader names the key header; empty means "Idempotency-Key".
	KeyHeader string

	// KeyForm says which key header forms are accepted.
	KeyForm idemserver.KeyForm

	// TTL is how long a stored response is replayed; zero means
	// [idemserver.DefaultTTL].
	TTL time.Duration

	// IsoLevel is the isolation level of the requests' transactions; empty
	// means the server's default (default_transaction_isolation, as
	// NewTxMiddleware reads it). The claim works at every level: under
	// REPEATABLE READ and SERIALIZABLE a duplicate still gets the stored
	// response or 409, never a 500. Under SERIALIZABLE the key is looked
	// up at READ COMMITTED before the transaction begins, a round trip
	// more, so that the key table's reads take no predicate locks (which
	// made requests with different keys fail each other).
	IsoLevel pgx.TxIsoLevel

	// SerializationRetries is how many times a keyed request whose
	// transaction fails with a serialization failure or a deadlock
	// (SQLSTATE 40001 or 40P01, from the handler's statements, as an error
	// it returns wrapping the *pgconn.PgError, or from the commit) is run
	// again, in a new transaction, before the client gets 503
	// ([TypeSerializationFailure]). Zero runs none again. The handler must
	// be safe to run again: everything it does in the database rolled
	// back, and calls it makes to other services carry keys from
	// [TxKey.DeriveKey]. Each run is a new run of the key (a new
	// TxKey.Token); a run that finds the key taken meanwhile answers as a
	// duplicate would. Requests without a key are not run again.
	SerializationRetries int

	// IdleTimeout, if positive, sets idle_in_transaction_session_timeout
	// for each request's transaction, so that PostgreSQL ends the
	// transaction of a server that vanished without closing its
	// connection (a host crash, a network partition) and frees its key
	// after IdleTimeout instead of after the TCP keepalive (two hours by
	// default on Linux). A handler that keeps the transaction idle longer
	// (a slow call to another service) is rolled back. Zero leaves the
	// server's setting.
	IdleTimeout time.Duration

	// DBTimeout bounds how long the middleware's own steps wait for the
	// database: the BEGIN that claims the key (bounded by the request's
	// context too: a request nobody waits for any more gives its
	// connection up), and the statement that stores the response with
	// COMMIT, the rollback and the looks at the key after it. A database
	// that does not answer in time (a partition) gets the request 503
	// with Retry-After; the connection is closed, so requests whose
	// database hangs do not fill the pool. A commit that timed out has an
	// unknown outcome: the key's lock (or its row) holds it until the
	// server ends the transaction, so a retry gets 409 or the replay,
	// never a second run. Zero means [idemserver.DefaultLockTimeout] (a
	// minute). The handler's own statements take the request's context.
	DBTimeout time.Duration

	// RetryAfter is the delay sent in Retry-After with 409 and 503; zero
	// means [idemserver.DefaultRetryAfter].
	RetryAfter time.Duration

	// MaxBodyBytes bounds the request body; zero or negative means
	// [idemserver.DefaultMaxBodyBytes].
	MaxBodyBytes int64

	// MaxStoredBody bounds the response body. A larger response is not
	// sent: the transaction rolls back and the client gets 500
	// ([TypeResponseTooLarge]), since a response that cannot be stored
	// cannot be committed. Zero or negative means
	// [idemserver.DefaultMaxStoredBody].
	MaxStoredBody int

	// ShouldStore reports whether a response with the given status is
	// stored and its transaction committed; otherwise the transaction
	// rolls back (a retry runs the request again, so its writes must not
	// stay) and the response is sent. Nil means
	// [idemserver.DefaultShouldStore], which commits no 5xx.
	ShouldStore func(status int) bool

	// Fingerprint identifies a request, to tell a retry of it from another
	// request reusing its key, as [idemserver.Middleware.Fingerprint] does.
	// Nil means [idemserver.DefaultFingerprint].
	Fingerprint func(r *http.Request, body []byte) string

	// WriteError writes the middleware's own error responses; nil means
	// [idemserver.WriteProblem].
	WriteError func(w http.ResponseWriter, r *http.Request, p *idemserver.Problem)

	// Logger receives handler errors and database failures at Error
	// level. Nil means [slog.Default]. A record names the request's
	// idempotency key by its digest (key_digest, see
	// [idemserver.KeyDigest]), never by the key itself, which names an
	// operation whose stored response it can fetch: the key is logged
	// (key, beside key_digest) only with Hooks.RecordKey, the one switch
	// that lets the key out of the middleware, as on
	// [idemserver.Middleware]. Nor is the principal's scope logged.
	Logger *slog.Logger

	// Hooks, when set, are told of every keyed request's claim and of how
	// it ended, as [idemserver.Middleware.Hooks] are: OnClaim (new, 409,
	// replay, 410, 422), then one of OnStored (committed; or, with
	// Replayable false, the key kept after the handler ended the
	// transaction itself), OnReleased (rolled back:
	// idemserver.ReleaseRolledBack for a handler error, a refused commit or
	// a serialization failure, ReleaseClaimLost, ReleaseServerError,
	// ReleaseNotStored, ReleaseNotStorable for a response too large or
	// invalid, or a 101, ReleasePanic) or OnStoreError (the claim or the
	// commit's outcome unknown: 503). OnRefused reports a request whose
	// Principal gave no scope. Requests without a key report nothing. Nil
	// costs nothing. The struct is copied by NewTxMiddleware.
	// Hooks.RecordKey also puts the key in Logger's records.
	Hooks *idemserver.Hooks
}

// TxMiddleware makes a [TxHandler] idempotent with the record of its
// response in the handler's own transaction: the recommended way to serve
// idempotent requests on PostgreSQL. It is a shell of the server core that
// idemserver.Middleware shares (docs/server.md at the repository's root):
// the two answer every case alike. For each request with a valid key it
//
//  1. begins a transaction and claims the key in it, in one statement:
//     it tries a transaction-level advisory lock on a 64-bit hash of the
//     key and of the key table's schema-qualified name, without waiting
//     (a concurrent request with the same key answers 409 with
//     Retry-After at once), and, with the lock, writes the key's claim
//     row, unless a live row holds the key (then the request replays the
//     stored response, or answers 409, 410 or 422). Advisory locks belong
//     to the database, so the table's name in the hash keeps applications
//     in separate schemas of one database (the layout the package
//     recommends) from ever blocking each other on a key;
//  2. runs the handler with the transaction, on a buffered writer;
//  3. writes the response into the claim row, in that same transaction;
//  4. commits, and only then sends the response.
//
// On a [*pgxpool.Pool] that is three round trips, as many as a handler
// that begins and commits a transaction of its own: BEGIN with the claim,
// the handler's statements, the stored response with COMMIT. Every
// statement names the key table resolved when the middleware was made, so
// that a handler's SET LOCAL search_path (a schema per tenant) cannot move
// a record elsewhere.
//
// The business write and the record of its response therefore commit
// together or not at all: a server killed at any point leaves either both
// (a retry gets the stored response, marked Idempotent-Replayed: true) or
// neither (the transaction aborts with the connection, the key is free at
// once, and a retry runs the request). A handler error, a response that is
// not to be stored (5xx by default), a handler that gave up on a client
// that left without answering, or a panic rolls back the transaction,
// which also frees the key; a panic continues to net/http after the
// rollback.
//
// Whatever the isolation level, the key's primary key is the last word:
// should two runs ever hold the key at once (instances of the previous
// release beside this one, whose lock differs: see docs/server.md), only
// one of their rows can commit, and the other's business write rolls back
// with it. A [Store] sharing the table waits for a running request's claim
// row, then finds its response.
//
// # Isolation levels
//
// The transactions run at [TxOptions].IsoLevel, or the server's default.
// Under REPEATABLE READ and SERIALIZABLE the snapshot is taken before the
// key's lock (by the statement that takes it), so a claim that meets a row
// committed just before its lock was free fails with a serialization
// failure: the key is then looked up afresh, at READ COMMITTED, and the
// request answered as a duplicate would be: the stored response, 409 or
// 422, never a 500. Under SERIALIZABLE the key is looked up at READ
// COMMITTED before the transaction begins (a round trip more), and the
// response is written into its row by the row's ctid, since a read of
// the key table through its index inside the transaction takes predicate
// locks that made requests with different keys fail each other. A
// transaction that fails with a serialization failure or a deadlock
// (SQLSTATE 40001, 40P01) of its own is answered 503 with Retry-After
// ([TypeSerializationFailure]): nothing committed, the key is free, and a
// retry with the same key runs it again. With
// [TxOptions].SerializationRetries the middleware runs it again itself.
//
// # A handler that ends the transaction
//
// The handler's [pgx.Tx] refuses Commit and Rollback, but a COMMIT or
// ROLLBACK sent as a statement (tx.Exec, or through tx.Conn(), which is
// kept for pgx's helpers that need the connection) ends the transaction
// all the same, and a record written after it would commit apart from the
// handler's writes. Its COMMIT (or COMMIT AND CHAIN) commits the key's
// claim row too, and releases the lock: a duplicate that arrives while the
// handler goes on finds the key in progress (409), never runs. The
// middleware reads the transaction's start time when it claims the key,
// and once the handler has returned it checks, on the connection itself,
// that a transaction is open and that it is the one begun then: the
// statement that stores the record compares the start time first (in the
// same round trip), and so does the one that goes with a rollback. A
// handler found to have ended the transaction gets 500 ([TypeTxEnded]),
// and since some of its writes may have committed, its key is kept as
// completed but not replayable: a retry gets 410
// ([idemserver.TypeNotReplayable]) and never runs it again. A server that
// dies before it kept the key leaves the committed claim row, which holds
// the key (409) for the TTL. One case is not told apart: a handler that
// commits, begins a new transaction and leaves that one aborted by a
// failed statement is taken for one whose statement failed (500,
// [TypeRolledBack]); its committed claim row still holds the key.
//
// # Why the claim is not committed first
//
// A claim committed in a transaction of its own (as [Store] makes) outlives
// a crashed server: its key answers 409 until the lock timeout passes (a
// minute by default), and a handler slower than that timeout loses its
// claim unless a heartbeat renews it. The claim here (the advisory lock,
// and the claim row, both in the request's transaction) is released by
// PostgreSQL the moment the server's connection closes (measured: the
// retry after a SIGKILL succeeded 6 ms to 85 ms later, against 1 s for a
// committed claim with a 1 s lock timeout), and no run, however slow, can
// lose it, so there is no heartbeat. Duplicates do not wait either: the
// advisory lock is tried, not waited for, whereas a committed claim's ON
// CONFLICT makes them queue on its row lock (see the package README for
// the numbers). The cost: a server that vanishes without closing its
// connections keeps its keys until PostgreSQL ends its sessions; set
// IdleTimeout to bound that. A database that does not answer holds no
// request past [TxOptions].DBTimeout.
//
// The handler's [pgx.Tx] refuses Commit and Rollback (return an error to
// roll back) and is closed once the handler returns. Begin makes a
// savepoint, as with any pgx transaction.
//
// The handler finds the key with [KeyFromContext], to put it in a UNIQUE
// column of its own, or to derive the keys of calls it makes to other
// services ([TxKey.DeriveKey]) so that a request run again after a crash
// sends them with the same keys.
//
// Requests that take no key (other methods, or keyless requests when the
// key is optional) also run in a transaction, committed unless the handler
// fails or answers 5xx (or ended the transaction itself: 500).
//
// # Shutdown and upgrades
//
// A server that stops rolls its open transactions back (PostgreSQL does,
// when their connections close): their keys are free at once. The key
// table is a versioned format (idemhttp_schema); rows written by the
// previous release replay after the upgrade (TestBaseline).
//
// Create one with [NewTxMiddleware]; it is safe for concurrent use.
type TxMiddleware struct {
	db          DB
	table       string     // the key table's schema-qualified name, which scopes the claims' advisory locks
	sql         *keysSQL   // the statements, on that table
	wire        *wireStmts // the statements TxMiddleware sends on the wire
	recovery    string     // the recovery table's schema-qualified name
	core        servercore.Config
	dbTimeout   time.Duration
	principal   func(*http.Request) string
	methods     []string
	required    bool
	header      string
	form        idemserver.KeyForm
	ttl         time.Duration
	isoLevel    pgx.TxIsoLevel
	lookupApart bool   // the transactions are SERIALIZABLE: look the key up before (see beginOnce)
	idleTimeout string // idle_in_transaction_session_timeout value, "" to leave it
	retryAfter  string
	maxBody     int64
	maxStored   int
	fingerprint func(*http.Request, []byte) string
	hooks       *idemserver.Hooks // a copy of TxOptions.Hooks, nil if none
	writeError  func(http.ResponseWriter, *http.Request, *idemserver.Problem)
	logger      *slog.Logger
	logKeys     bool // Hooks.RecordKey: the log names keys, not only their digests
	tokenPrefix string
	tokens      atomic.Uint64

	// at, when set (by tests), is called at each step of a request.
	at func(step string)
}

// NewTxMiddleware returns a TxMiddleware on db, which must be the primary:
// it fails with [ErrStandby] on a standby. The idemhttp_keys table must
// exist ([Migrate]): the middleware's statements name the table (and its
// claims' locks are scoped to it) that db's search_path finds now; one of
// a newer release is refused ([ErrNewerSchema]). A nil opts means the defaults, which need
// opts.Principal or opts.SingleTenant, so nil is refused.
//
// Route every statement of these transactions to the primary: never put
// a pooler that sends reads to replicas in front of db. Poolers in
// transaction mode (PgBouncer's pool_mode = transaction) are fine.
//
// On a [github.com/jackc/pgx/v5/pgxpool.Pool], the middleware's own statements (the claim, the
// stored response and COMMIT) are written straight to the connection, in
// the pool's QueryExecMode: prepared once per connection (named
// idemhttp_ and a hash) in pgx's default mode, parsed in each round trip
// in the modes that keep no statement prepared. A pool with a Tracer, or
// on the simple protocol, sends them through pgx, which the tracer then
// sees. A connection whose statements the server no longer holds as
// prepared (a session reset, a DEALLOCATE, a schema change) is closed,
// and the claim tried again on another.
func NewTxMiddleware(ctx context.Context, db DB, opts *TxOptions) (*TxMiddleware, error) {
	if opts == nil {
		opts = &TxOptions{}
	}
	switch {
	case opts.Principal == nil && !opts.SingleTenant:
		return nil, errors.New("idemhttp/postgres: tx middleware: set Principal, or SingleTenant if one party uses the server")
	case opts.Principal != nil && opts.SingleTenant:
		return nil, errors.New("idemhttp/postgres: tx middleware: both Principal and SingleTenant are set")
	}
	if err := CheckPrimary(ctx, db); err != nil {
		return nil, err
	}
	table, err := keysTable(ctx, db)
	if err != nil {
		return nil, err
	}
	recovery, err := recoveryTable(ctx, db)
	if err != nil {
		return nil, err
	}
	iso := string(opts.IsoLevel)
	if iso == "" {
		err := retry(ctx, func() error {
			return db.QueryRow(ctx, "SELECT current_setting('default_transaction_isolation')").Scan(&iso)
		})
		if err != nil {
			return nil, fmt.Errorf("idemhttp/postgres: tx middleware: read the default isolation: %w", err)
		}
	}
	m := &TxMiddleware{
		db:          db,
		table:       table,
		sql:         newKeysSQL(table),
		recovery:    recovery,
		dbTimeout:   opts.DBTimeout,
		principal:   opts.Principal,
		methods:     slices.Clone(opts.Methods),
		required:    opts.Required,
		header:      opts.KeyHeader,
		form:        opts.KeyForm,
		ttl:         opts.TTL,
		isoLevel:    opts.IsoLevel,
		lookupApart: strings.EqualFold(iso, string(pgx.Serializable)),
		maxBody:     opts.MaxBodyBytes,
		maxStored:   opts.MaxStoredBody,
		fingerprint: opts.Fingerprint,
		hooks:       copyHooks(opts.Hooks),
		writeError:  opts.WriteError,
		logger:      opts.Logger,
		logKeys:     opts.Hooks != nil && opts.Hooks.RecordKey,
		tokenPrefix: newTokenPrefix(),
	}
	if m.methods == nil {
		m.methods = []string{http.MethodPost, http.MethodPatch}
	}
	if m.header == "" {
		m.header = idemhttp.DefaultKeyHeader
	}
	m.header = http.CanonicalHeaderKey(m.header)
	if m.ttl <= 0 {
		m.ttl = idemserver.DefaultTTL
	}
	if opts.IdleTimeout > 0 {
		m.idleTimeout = millis(opts.IdleTimeout)
	}
	switch ra := opts.RetryAfter; {
	case ra < 0:
		m.retryAfter = "0"
	case ra == 0:
		ra = idemserver.DefaultRetryAfter
		fallthrough
	default:
		m.retryAfter = strconv.FormatInt(int64((ra+time.Second-1)/time.Second), 10)
	}
	if m.maxBody <= 0 {
		m.maxBody = idemserver.DefaultMaxBodyBytes
	}
	if m.maxStored <= 0 {
		m.maxStored = idemserver.DefaultMaxStoredBody
	}
	m.wire = newWireStmts(m.sql, txBeginSQL(m.isoLevel))
	m.core = servercore.Config{
		Mode:                 servercore.Transactional,
		ShouldStore:          opts.ShouldStore,
		SerializationRetries: max(opts.SerializationRetries, 0),
	}
	if m.fingerprint == nil {
		m.fingerprint = idemserver.DefaultFingerprint
		m.core.DefaultFingerprint = true
	}
	if m.dbTimeout <= 0 {
		m.dbTimeout = idemserver.DefaultLockTimeout
	}
	if m.writeError == nil {
		m.writeError = func(w http.ResponseWriter, _ *http.Request, p *idemserver.Problem) { idemserver.WriteProblem(w, p) }
	}
	if m.logger == nil {
		m.logger = slog.Default()
	}
	return m, nil
}

// millis renders d, rounded up to a millisecond, as a PostgreSQL setting.
func millis(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10) + "ms"
}

func newTokenPrefix() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	return "tx-" + hex.EncodeToString(b[:]) + "-"
}

// keysTable returns the schema-qualified name of the idemhttp_keys table
// that db's search_path finds, the table the middleware's and the store's
// statements name, or an error if there is none (Migrate has not run).
func keysTable(ctx context.Context, db DB) (string, error) {
	return findTable(ctx, db, "idemhttp_keys")
}

// recoveryTable is keysTable for idemhttp_recovery.
func recoveryTable(ctx context.Context, db DB) (string, error) {
	return findTable(ctx, db, "idemhttp_recovery")
}

// keysVersion is the version of the key table's format this release
// reads and writes (see schema.sql's idemhttp_schema).
const keysVersion = 1

// ErrNewerSchema is returned by [NewStore] and [NewTxMiddleware] when the
// key table was laid out by a newer release (its idemhttp_schema row has a
// version this release does not know): this release might misread its
// rows and run a key twice, so it refuses to start.
var ErrNewerSchema = errors.New("idemhttp/postgres: the tables are of a newer release")

// findTable returns the schema-qualified name of the table name that
// db's search_path finds, after checking, for idemhttp_keys, that its
// format is one this release reads.
func findTable(ctx context.Context, db DB, name string) (string, error) {
	var table, nsp *string
	err := retry(ctx, func() error {
		return db.QueryRow(ctx, `
SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), quote_ident(n.nspname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`, name).Scan(&table, &nsp)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && table == nil):
		return "", fmt.Errorf("idemhttp/postgres: no %s table on the search_path; run Migrate first", name)
	case err != nil:
		return "", fmt.Errorf("idemhttp/postgres: find %s: %w", name, err)
	}
	if name != "idemhttp_keys" {
		return *table, nil
	}
	// The version row, if the table of versions is there (a database
	// Migrate made before it existed is at version 1). nsp is quoted.
	var version int
	err = retry(ctx, func() error {
		var exists bool
		if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, *nsp+".idemhttp_schema").Scan(&exists); err != nil || !exists {
			return err
		}
		err := db.QueryRow(ctx, `SELECT version FROM `+*nsp+`.idemhttp_schema WHERE component = 'keys'`).Scan(&version)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	switch {
	case err != nil:
		return "", fmt.Errorf("idemhttp/postgres: read the version of %s: %w", *table, err)
	case version > keysVersion:
		return "", fmt.Errorf("%w: %s is at version %d, this release reads %d", ErrNewerSchema, *table, version, keysVersion)
	}
	return *table, nil
}

// CheckPrimary returns [ErrStandby] if db is connected to a standby
// (pg_is_in_recovery()), and an error if it cannot tell.
func CheckPrimary(ctx context.Context, db DB) error {
	var standby bool
	err := retry(ctx, func() error {
		return db.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby)
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: check primary: %w", err)
	}
	if standby {
		return ErrStandby
	}
	return nil
}

// Wrap returns an [http.Handler] that serves each request with h inside a
// transaction, as the type's documentation describes.
func (m *TxMiddleware) Wrap(h TxHandler) http.Handler {
	return &txHandler{m: m, next: h}
}

// WrapFunc is Wrap for a function.
func (m *TxMiddleware) WrapFunc(f func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error) http.Handler {
	return m.Wrap(TxHandlerFunc(f))
}

// TxKey is the idempotency key a request runs under, as [KeyFromContext]
// returns it to a [TxHandler].
type TxKey struct {
	Key   string // the key as the client sent it
	Scope string // the principal's scope; "" with SingleTenant
	Token string // unique to this run of the request

	// recovery is the recovery table's schema-qualified name, as the
	// middleware resolved it; empty for a TxKey made by hand, whose
	// recovery points go to the table the search_path finds.
	recovery string
	// request is the request's fingerprint, which its recovery points
	// are saved under; empty for a TxKey made by hand.
	request string
}

type txKeyContext struct{}

// KeyFromContext returns the idempotency key of the request whose context
// ctx is, inside a [TxHandler] wrapped by [TxMiddleware]; false for a
// request without a key. Store Scope and Key in a UNIQUE column of the
// business row, so that even a write made outside the middleware's
// protection cannot happen twice.
func KeyFromContext(ctx context.Context) (TxKey, bool) {
	k, ok := ctx.Value(txKeyContext{}).(TxKey)
	return k, ok
}

// DeriveKey returns the idempotency key for one call the request makes to
// another service, named by step ("charge", "email"): [idemhttp.DeriveKey]
// of secret and the request's scope, key and step. A request run again
// after a crash derives the same key, so the other service replays its
// first answer instead of acting twice. Send such calls from inside the
// transaction (the single-transaction form of Brandur Leach's atomic
// phases): if the transaction then rolls back, the retry sends the same
// call with the same key.
func (k TxKey) DeriveKey(secret []byte, step string) (string, error) {
	return idemhttp.DeriveKey(secret, idemserver.ScopedKey(k.Scope, k.Key)+"\x00"+step)
}

// txHandler is a wrapped TxHandler.
type txHandler struct {
	m    *TxMiddleware
	next TxHandler
}

func (h *txHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m := h.m
	if !slices.Contains(m.methods, r.Method) {
		h.serveKeyless(w, r)
		return
	}
	values := r.Header[m.header]
	switch {
	case len(values) == 0 && m.required:
		m.writeError(w, r, idemserver.ProblemKeyMissing(m.header))
		return
	case len(values) == 0:
		h.serveKeyless(w, r)
		return
	case len(values) > 1:
		m.writeError(w, r, idemserver.ProblemKeyInvalid(m.header, "The request carries more than one "+m.header+" header."))
		return
	}
	key, err := idemserver.ParseKey(values[0], m.form)
	if err != nil {
		m.writeError(w, r, idemserver.ProblemKeyInvalid(m.header, err.Error()))
		return
	}
	body, err := idemserver.ReadBody(r, m.maxBody)
	if err != nil {
		if errors.Is(err, idemserver.ErrBodyTooLarge) {
			m.writeError(w, r, idemserver.ProblemBodyTooLarge(m.maxBody))
		} else {
			m.writeError(w, r, idemserver.ProblemBodyUnreadable())
		}
		return
	}
	r.Body = &bodyReader{b: body}
	scope := ""
	if m.principal != nil {
		if scope = m.principal(r); scope == "" {
			// As idemserver does: one key space for every caller the
			// Principal cannot name would let one replay another's
			// response.
			m.logger.ErrorContext(r.Context(), "idemhttp/postgres: Principal returned an empty scope; answered 500 and ran nothing", m.logKey(key))
			m.writeError(w, r, idemserver.ProblemNoPrincipal())
			rep := h.reporter(r, &txClaim{TxKey: TxKey{Key: key}})
			rep.refused(idemserver.RefusedNoPrincipal, http.StatusInternalServerError, errNoPrincipal)
			return
		}
	}
	fp := m.fingerprint(r, body)
	c := &txClaim{
		TxKey:       TxKey{Key: key, Scope: scope, Token: m.newToken(), recovery: m.recovery, request: fp},
		fingerprint: fp,
		body:        body,
	}
	c.row = scopedRowKey(scope, key)
	c.lock = advisoryKey(m.table, c.row)
	h.serve(w, r, c)
}

// txClaim is a keyed request's claim.
type txClaim struct {
	TxKey
	fingerprint string
	fp          []byte // fingerprint, as pgx sends it (see fpBytes)
	tokenBytes  []byte // Token, as pgx sends it (see token)
	row         []byte // the key's primary key in idemhttp_keys
	lock        int64  // the key's advisory lock
	body        []byte // the request body, for a run again
}

// token returns the claim's token as the statements send it, converted
// once per run.
func (c *txClaim) token() []byte {
	if string(c.tokenBytes) != c.Token {
		c.tokenBytes = []byte(c.Token)
	}
	return c.tokenBytes
}

// fpBytes returns the claim's fingerprint as pgx sends it, converted
// once.
func (c *txClaim) fpBytes() []byte {
	if c.fp == nil {
		c.fp = []byte(c.fingerprint)
	}
	return c.fp
}

// step calls the test hook, if any.
func (h *txHandler) step(name string) {
	if h.m.at != nil {
		h.m.at(name)
	}
}
