//go:build ignore

// gen writes the golden data of the release before this one (commit
// 2d053bb): the values its idemserver.Middleware, on its Redis Store,
// left in Redis for the requests of a fixed list (records.tsv: each key,
// without its prefix, and its value, hex), and the list itself with each
// request's answer (requests.tsv). TestBaselineRecords reads them.
//
// Run it in a git worktree of that commit, from its contrib/redis
// directory, with the test server of .ci/services.sh:
//
//	git worktree add ../baseline 2d053bb
//	cp gen.go ../baseline/contrib/redis/gen_golden.go
//	cd ../baseline/contrib/redis
//	IDEMHTTP_REDIS_ADDR=... go run gen_golden.go -out <this directory>
//
// It uses only what that release exported.
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
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
)

type request struct {
	name, account, key, ct, body, do string
}

var requests = []request{
	{"json", "acct_1", "r-json", "application/json", `{"currency":"usd","amount":2000}`, "charge"},
	{"json-other-tenant", "acct_2", "r-json", "application/json", `{"amount":2000,"currency":"usd"}`, "charge"},
	{"form", "acct_1", "r-form", "application/x-www-form-urlencoded", "currency=usd&amount=1", "charge"},
	{"binary", "acct_1", "r-bin", "application/octet-stream", "\x00\xff\x01", "charge"},
	{"4xx", "acct_1", "r-4xx", "application/json", `{"amount":-1}`, "bad"},
	{"big", "acct_1", "r-big", "application/json", `{"amount":3}`, "big"},
}

func main() {
	out := flag.String("out", ".", "the directory to write records.tsv and requests.tsv to")
	flag.Parse()
	addr := os.Getenv("IDEMHTTP_REDIS_ADDR")
	if addr == "" {
		log.Fatal("IDEMHTTP_REDIS_ADDR is not set")
	}
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	prefix := "idemgold:" + hex.EncodeToString(b) + ":"
	store := idemredis.NewStore(c, &idemredis.Options{Prefix: prefix})
	runs := 0
	mw := &idemserver.Middleware{Store: store, Principal: func(r *http.Request) string { return r.Header.Get("X-Account") }, MaxStoredBody: 64}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	var tsv bytes.Buffer
	tsv.WriteString("# name\taccount\tkey\tcontent-type\tbody\tdo\tstatus\tresponse\tx-charge\n")
	for _, q := range requests {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(q.body))
		r.Header.Set("Idempotency-Key", q.key)
		r.Header.Set("X-Account", q.account)
		r.Header.Set("X-Do", q.do)
		r.Header.Set("Content-Type", q.ct)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Fprintf(&tsv, "%s\t%s\t%s\t%q\t%q\t%s\t%d\t%q\t%s\n", q.name, q.account, q.key, q.ct, q.body, q.do, w.Code, w.Body.String(), w.Header().Get("X-Charge"))
	}
	// A claim in progress, as the Store leaves it while its handler runs.
	r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(`{"amount":7}`))
	r.Header.Set("Content-Type", "application/json")
	_, err := store.Claim(ctx, idemserver.ScopedKey("acct_1", "r-claim"), idemserver.Claim{
		Token: "gold-claim", Fingerprint: idemserver.DefaultFingerprint(r, []byte(`{"amount":7}`)), LockTimeout: time.Hour})
	check(err)
	fmt.Fprintf(&tsv, "%s\t%s\t%s\t%q\t%q\t%s\t%d\t%q\t%s\n", "claim", "acct_1", "r-claim", "application/json", `{"amount":7}`, "charge", 0, "", "")

	keys, err := c.Keys(ctx, prefix+"*").Result()
	check(err)
	sort.Strings(keys)
	var rec bytes.Buffer
	rec.WriteString("# The values the release at commit 2d053bb left in Redis for requests.tsv\n" +
		"# (see gen.go): each key without its prefix, and its value, hex. Never\n" +
		"# regenerate it: it is what that release left.\n")
	for _, k := range keys {
		v, err := c.Get(ctx, k).Bytes()
		check(err)
		fmt.Fprintf(&rec, "%s\t%s\n", hex.EncodeToString([]byte(strings.TrimPrefix(k, prefix))), hex.EncodeToString(v))
		check(c.Del(ctx, k).Err())
	}
	check(os.WriteFile(filepath.Join(*out, "records.tsv"), rec.Bytes(), 0o644))
	check(os.WriteFile(filepath.Join(*out, "requests.tsv"), tsv.Bytes(), 0o644))
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
