package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// The examples need a PostgreSQL server, so they are compiled but not run.

// Every instance of a service shares the store, so that a retry landing on
// another instance finds the first request's claim or response.
func ExampleNewStore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the primary
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	// Expired records are invisible at once; call store.Prune now and
	// then (from a timer or a cron job) to reclaim their space.
	store, err := postgres.NewStore(ctx, pool)
	if err != nil {
		log.Fatal(err) // no idemhttp_keys table on the search_path, or no database
	}

	mw := &idemserver.Middleware{
		Store:     store,
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
	}
	http.Handle("POST /v1/charges", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// A producer loads a batch into the journal; any number of workers then
// work through it. Entries carry everything a worker needs to send them.
func ExampleJournal_Enqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	j := postgres.NewJournal(pool, nil)
	for _, order := range []string{"order-1", "order-2", "order-3"} {
		url := "https://api.example.com/v1/charges"
		body := []byte(`{"amount":1099,"order":"` + order + `"}`)
		_, err := j.Enqueue(ctx, &idemhttp.Entry{
			Operation: order, // enqueueing the batch twice adds nothing
			Key:       idemhttp.NewKey(),
			Method:    http.MethodPost,
			URL:       url,
			Header:    http.Header{"Content-Type": {"application/json"}},
			Body:      body,
		})
		if err != nil {
			log.Fatal(err)
		}
	}
}

// A worker claims pending entries with a lease and sends each with its
// own key, operation and body. When a worker dies, its entries' leases
// expire and another worker resends them with the same keys.
func ExampleJournal_ClaimPending() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	j := postgres.NewJournal(pool, &postgres.JournalOptions{Lease: 2 * time.Minute})
	client := &idemhttp.Client{
		Journal: j, // records each outcome, which ends the lease
		PrepareRequest: func(r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+os.Getenv("API_KEY")) // never journaled
			return nil
		},
	}
	for {
		entries, err := j.ClaimPending(ctx, 16)
		if err != nil {
			log.Fatal(err)
		}
		if len(entries) == 0 {
			pending, err := j.Pending(ctx)
			if err != nil {
				log.Fatal(err)
			}
			if len(pending) == 0 {
				return // the batch is done
			}
			time.Sleep(time.Second) // others hold the rest; a dead one's leases will expire
			continue
		}
		for _, e := range entries {
			rctx := idemhttp.WithKey(ctx, e.Key)
			if e.Operation != "" {
				rctx = idemhttp.WithOperation(rctx, e.Operation)
			}
			req, err := http.NewRequestWithContext(rctx, e.Method, e.URL, bytes.NewReader(e.Body))
			if err != nil {
				log.Fatal(err)
			}
			for name, vals := range e.Header {
				req.Header[name] = vals
			}
			resp, err := client.Do(req)
			switch {
			case errors.Is(err, idemhttp.ErrKeyExpired):
				// The server has forgotten the key: resending could run the
				// operation twice. Leave it to a person.
				_ = j.Finish(ctx, e.Key, idemhttp.Outcome{State: idemhttp.StateAbandoned})
			case err != nil:
				log.Printf("%s: %v (retried after the lease)", e.Operation, err)
			default:
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
}

// The recommended way on PostgreSQL: the handler writes its rows with the
// middleware's transaction, which also stores the response and commits
// both at once; the response is sent after the commit. A call to another
// service carries a key derived from the request's, so that a retry after
// a crash sends it with the same key.
func ExampleNewTxMiddleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the primary
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	mw, err := postgres.NewTxMiddleware(ctx, pool, &postgres.TxOptions{
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
		Required:  true,
		DBTimeout: 5 * time.Second, // a database that does not answer: 503, the connection given up
	})
	if err != nil {
		log.Fatal(err) // postgres.ErrStandby: pointed at a replica; ErrNewerSchema: a newer release's tables
	}
	secret := []byte(os.Getenv("KEY_SECRET")) // at least 32 bytes
	payments := &idemhttp.Client{}

	http.Handle("POST /v1/orders", mw.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		k, _ := postgres.KeyFromContext(r.Context())
		var id int64
		err := tx.QueryRow(r.Context(),
			`INSERT INTO orders (account, idem_key) VALUES ($1, $2) RETURNING id`, // UNIQUE (account, idem_key)
			k.Scope, k.Key).Scan(&id)
		if err != nil {
			return err // rolled back, and the key is free for a retry
		}
		chargeKey, err := k.DeriveKey(secret, "charge")
		if err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(idemhttp.WithKey(r.Context(), chargeKey),
			http.MethodPost, "https://payments.example.com/v1/charges", strings.NewReader(`{"amount":1099}`))
		if err != nil {
			return err
		}
		resp, err := payments.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err = fmt.Fprintf(w, `{"order":%d}`, id)
		return err
	}))
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// A handler that must commit between phases saves a recovery point before
// its slow call to another service, and a run of the same key after a
// crash resumes from it. The last phase commits with the response and
// clears the points.
func ExampleSaveRecoveryPoint() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	mw, err := postgres.NewTxMiddleware(ctx, pool, &postgres.TxOptions{
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
	})
	if err != nil {
		log.Fatal(err)
	}
	secret := []byte(os.Getenv("KEY_SECRET"))
	shipping := &idemhttp.Client{}

	http.Handle("POST /v1/shipments", mw.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		k, _ := postgres.KeyFromContext(r.Context())
		label, ok, err := postgres.LoadRecoveryPoint(r.Context(), tx, k, "label")
		if err != nil {
			return err
		}
		if !ok { // phase one: buy the label, once per key
			key, err := k.DeriveKey(secret, "label")
			if err != nil {
				return err
			}
			req, err := http.NewRequestWithContext(idemhttp.WithKey(r.Context(), key),
				http.MethodPost, "https://shipping.example.com/v1/labels", strings.NewReader(`{}`))
			if err != nil {
				return err
			}
			resp, err := shipping.Do(req)
			if err != nil {
				return err
			}
			label, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if err := postgres.SaveRecoveryPoint(r.Context(), pool, k, "label", label); err != nil {
				return err
			}
		}
		// Phase two, committed with the response.
		if _, err := tx.Exec(r.Context(), `INSERT INTO shipments (account, idem_key, label) VALUES ($1, $2, $3)`,
			k.Scope, k.Key, label); err != nil {
			return err
		}
		if err := postgres.ClearRecoveryPoints(r.Context(), tx, k); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}))
	log.Fatal(http.ListenAndServe(":8080", nil))
}
