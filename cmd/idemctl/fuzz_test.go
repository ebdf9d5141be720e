package main

import (
	"bytes"
	"net/url"
	"os"
	"strings"
	"testing"
)

// FuzzReadCSV: any CSV input is read without a panic; every operation
// has a valid id and stays on -url's server; reading the same input twice
// gives the same bytes (a rerun must match the journal's fingerprint); a
// form body parses as a form.
func FuzzReadCSV(f *testing.F) {
	for _, s := range []string{
		"id,amount,currency\na,1000,usd\n",
		"id,method,path,body\nr,put,/v1/refunds,\"{\"\"a\"\":1}\"\n",
		"\ufeffid,metadata[order]\n# c\nx,o-1\n,\nb,1,2\n",
		"id,body\na,amount=1&currency=usd\n",
		"amount\n1\n",
		"id,\"bare\"quote\n",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	base, _ := url.Parse("https://api.example.com/v1/charges")
	f.Fuzz(func(t *testing.T, data string, form bool) {
		body := bodyJSON
		if form {
			body = bodyForm
		}
		spec := inputSpec{format: formatCSV, body: body}
		ops, _, err := readInputAs(strings.NewReader(data), base, spec)
		again, _, err2 := readInputAs(strings.NewReader(data), base, spec)
		if (err == nil) != (err2 == nil) || len(ops) != len(again) {
			t.Fatalf("two reads differ: %v / %v, %d / %d ops", err, err2, len(ops), len(again))
		}
		for i, op := range ops {
			if op.ID == "" || !bytes.Equal(op.Body, again[i].Body) || op.URL != again[i].URL {
				t.Fatalf("op %d: %+v vs %+v", i, op, again[i])
			}
			u, err := url.Parse(op.URL)
			if err != nil || u.Host != base.Host || u.Scheme != base.Scheme {
				t.Fatalf("op %q left -url's server: %s", op.ID, op.URL)
			}
			if form && op.Body != nil {
				if _, err := url.ParseQuery(string(op.Body)); err != nil {
					t.Fatalf("op %q: form body %q does not parse: %v", op.ID, op.Body, err)
				}
			}
		}
	})
}

// FuzzFormFromJSON: any JSON becomes a form that parses, or an error; the
// same JSON always gives the same bytes.
func FuzzFormFromJSON(f *testing.F) {
	for _, s := range []string{`{"amount":1000,"currency":"usd"}`, `{"m":{"a":"b"},"l":[1,{"x":null}],"t":true}`, `"a=1&b=2"`, `[1]`, `{"":1}`, `{"a":1e400}`, `nul`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := formFromJSON([]byte(raw))
		if err != nil {
			return
		}
		if _, err := url.ParseQuery(string(got)); err != nil {
			t.Fatalf("formFromJSON(%q) = %q, which does not parse: %v", raw, got, err)
		}
		again, _ := formFromJSON([]byte(raw))
		if !bytes.Equal(got, again) {
			t.Fatalf("formFromJSON(%q) gave %q then %q", raw, got, again)
		}
	})
}

// FuzzReadPruned: any record file is read without a panic; a torn last
// line never hides the lines before it.
func FuzzReadPruned(f *testing.F) {
	good := `{"operation":"a","key":"k","state":"done","status":200,"updated":"2026-01-01T00:00:00Z","pruned":"2026-01-02T00:00:00Z"}` + "\n"
	for _, s := range []string{"", good, good + `{"operation":"b"`, "{oops\n" + good, "\n\n", good + good} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		path := t.TempDir() + "/j.pruned"
		if err := writeFileForFuzz(path, data); err != nil {
			t.Fatal(err)
		}
		recs, err := readPruned(path, nil)
		if err != nil {
			return
		}
		if strings.HasPrefix(data, good) && recs["a"].Key != "k" {
			t.Fatalf("the first, intact line was lost: %v", recs)
		}
	})
}

func writeFileForFuzz(path, data string) error {
	return os.WriteFile(path, []byte(data), 0o600)
}
