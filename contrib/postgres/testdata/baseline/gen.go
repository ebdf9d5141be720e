//go:build ignore

// gen writes the golden data of the release before this one (commit
// 2d053bb): the idemhttp tables as that release's Migrate made them and
// the rows its idemserver.Middleware (on the PostgreSQL Store) and its
// TxMiddleware wrote for the requests of a fixed list, dumped by pg_dump
// (keys.sql, the schema's name replaced by __SCHEMA__), and the list
// itself with each request's answer and, for TxMiddleware's, the advisory
// lock it held (requests.tsv). TestBaseline reads them.
//
// Run it in a git worktree of that commit, from its contrib/postgres
// directory, with the test server of .ci/services.sh:
//
//	git worktree add ../baseline 2d053bb
//	cp gen.go ../baseline/contrib/postgres/gen_golden.go
//	cd ../baseline/contrib/postgres
//	IDEMHTTP_POSTGRES_URL=... go run gen_golden.go -out <this directory>
//
// It uses only what that release exported, and pg_dump (15).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// request is one request of the list.
type request struct {
	name, mode, account, key, ct, body, do string
}

var requests = []request{
	{"store-json", "store", "acct_1", "s-json", "application/json", `{"currency":"usd","amount":2000}`, "charge"},
	{"store-json-other-tenant", "store", "acct_2", "s-json", "application/json", `{"amount":2000,"currency":"usd"}`, "charge"},
	{"store-form", "store", "acct_1", "s-form", "application/x-www-form-urlencoded", "currency=usd&amount=1", "charge"},
	{"store-text", "store", "acct_1", "s-text", "text/plain; charset=utf-8", "plain body", "charge"},
	{"store-multipart", "store", "acct_1", "s-multipart", "multipart/form-data; boundary=xyz", "--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--xyz--\r\n", "charge"},
	{"store-4xx", "store", "acct_1", "s-4xx", "application/json", `{"amount":-1}`, "bad"},
	{"store-big", "store", "acct_1", "s-big", "application/json", `{"amount":3}`, "big"},
	{"tx-json", "tx", "acct_1", "t-json", "application/json", `{"amount":2000,"currency":"usd","metadata":{"b":1,"a":2}}`, "charge"},
	{"tx-form", "tx", "acct_1", "t-form", "application/x-www-form-urlencoded", "b=2&a=1", "charge"},
	{"tx-4xx", "tx", "acct_1", "t-4xx", "application/json", `{"amount":-1}`, "bad"},
	{"tx-long-key", "tx", strings.Repeat("tenant-", 40), "t-long", "application/json", `{"amount":5}`, "charge"},
}

func main() {
	out := flag.String("out", ".", "the directory to write keys.sql and requests.tsv to")
	flag.Parse()
	url := os.Getenv("IDEMHTTP_POSTGRES_URL")
	if url == "" {
		log.Fatal("IDEMHTTP_POSTGRES_URL is not set")
	}
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "idemgold_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, url)
	check(err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	check(err)
	defer admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	cfg, err := pgxpool.ParseConfig(url)
	check(err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	check(err)
	defer pool.Close()
	check(postgres.Migrate(ctx, pool))

	account := func(r *http.Request) string { return r.Header.Get("X-Account") }
	runs := 0
	answer := func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Charge", "ch_"+strconv.Itoa(runs))
		switch r.Header.Get("X-Do") {
		case "bad":
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"amount"}`)
		case "big":
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"`+strings.Repeat("x", 100)+`"}`)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"ch_%d"}`, runs)
		}
	}
	mw := &idemserver.Middleware{Store: postgres.NewStore(pool), Principal: account, MaxStoredBody: 64}
	store := mw.Wrap(http.HandlerFunc(answer))
	var lock int64
	txm, err := postgres.NewTxMiddleware(ctx, pool, &postgres.TxOptions{Principal: account, MaxStoredBody: 64})
	check(err)
	tx := txm.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		// The lock this request holds, as pg_locks shows a bigint key.
		err := tx.QueryRow(r.Context(), `
SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND pid = pg_backend_pid()`).Scan(&lock)
		if err != nil {
			return err
		}
		answer(w, r)
		return nil
	})

	var tsv bytes.Buffer
	tsv.WriteString("# name\tmode\taccount\tkey\tcontent-type\tbody\tdo\tstatus\tresponse\tx-charge\tlock\n")
	for _, q := range requests {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(q.body))
		r.Header.Set("Idempotency-Key", q.key)
		r.Header.Set("X-Account", q.account)
		r.Header.Set("X-Do", q.do)
		r.Header.Set("Content-Type", q.ct)
		w := httptest.NewRecorder()
		lock = 0
		if q.mode == "tx" {
			tx.ServeHTTP(w, r)
		} else {
			store.ServeHTTP(w, r)
		}
		fmt.Fprintf(&tsv, "%s\t%s\t%s\t%s\t%q\t%q\t%s\t%d\t%q\t%s\t%d\n",
			q.name, q.mode, q.account, q.key, q.ct, q.body, q.do, w.Code, w.Body.String(), w.Header().Get("X-Charge"), lock)
	}
	// A claim in progress, as a Store leaves it while its handler runs.
	r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(`{"amount":7}`))
	r.Header.Set("Content-Type", "application/json")
	_, err = postgres.NewStore(pool).Claim(ctx, idemserver.ScopedKey("acct_1", "s-claim"), idemserver.Claim{
		Token: "gold-claim", Fingerprint: idemserver.DefaultFingerprint(r, []byte(`{"amount":7}`)), LockTimeout: 24 * time.Hour})
	check(err)
	fmt.Fprintf(&tsv, "%s\t%s\t%s\t%s\t%q\t%q\t%s\t%d\t%q\t%s\t%d\n",
		"store-claim", "store", "acct_1", "s-claim", "application/json", `{"amount":7}`, "charge", 0, "", "", 0)

	dump, err := exec.Command("pg_dump", "--dbname="+url, "--schema="+schema, "--no-owner", "--no-privileges",
		"--inserts", "--no-comments").Output()
	check(err)
	dump = bytes.ReplaceAll(dump, []byte(schema), []byte("__SCHEMA__"))
	header := "-- The idemhttp tables of the release at commit 2d053bb after the requests\n" +
		"-- of requests.tsv, dumped by pg_dump 15 (see gen.go); the schema's name is\n" +
		"-- __SCHEMA__. Never regenerate it: it is what that release left.\n"
	check(os.WriteFile(filepath.Join(*out, "keys.sql"), append([]byte(header), dump...), 0o644))
	check(os.WriteFile(filepath.Join(*out, "requests.tsv"), tsv.Bytes(), 0o644))
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
