package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReadCSV(t *testing.T) {
	base := "https://api.example.com/v1/charges"
	tests := []struct {
		name    string
		give    string
		body    string
		wantOps []operation
		wantBad []int
		wantErr string
	}{
		{
			name:    "fields as a JSON object of strings, sorted",
			give:    "id,currency,amount\na,usd,1000\n",
			body:    bodyJSON,
			wantOps: []operation{{Line: 2, ID: "a", Method: "POST", URL: base, Body: []byte(`{"amount":"1000","currency":"usd"}`)}},
		},
		{
			name:    "fields as a form, Stripe names kept, empty cells left out",
			give:    "id,amount,currency,metadata[order],description\na,1000,usd,o-1,\n",
			body:    bodyForm,
			wantOps: []operation{{Line: 2, ID: "a", Method: "POST", URL: base, Body: []byte(`amount=1000&currency=usd&metadata%5Border%5D=o-1`)}},
		},
		{
			name:    "a body column, method and path",
			give:    "id,method,path,body\nr,put,/v1/refunds,\"{ \"\"charge\"\": \"\"ch_1\"\" }\"\n",
			body:    bodyJSON,
			wantOps: []operation{{Line: 2, ID: "r", Method: "PUT", URL: "https://api.example.com/v1/refunds", Body: []byte(`{"charge":"ch_1"}`)}},
		},
		{
			name:    "a form body column",
			give:    "id,body\na,amount=1&currency=usd\n",
			body:    bodyForm,
			wantOps: []operation{{Line: 2, ID: "a", Method: "POST", URL: base, Body: []byte(`amount=1&currency=usd`)}},
		},
		{
			name:    "bad rows reported by line, the others kept; comments skipped",
			give:    "\ufeffid,amount\n# a comment\na,1\n,2\nb,1,extra\na,3\nc,\"bare\"quote\"\nd,4\n",
			body:    bodyForm,
			wantOps: []operation{{Line: 3, ID: "a", Method: "POST", URL: base, Body: []byte(`amount=1`)}, {Line: 8, ID: "d", Method: "POST", URL: base, Body: []byte(`amount=4`)}},
			wantBad: []int{4, 5, 6, 7},
		},
		{name: "no id column", give: "amount,currency\n1,usd\n", body: bodyJSON, wantErr: "no id column"},
		{name: "body and fields", give: "id,body,amount\na,{},1\n", body: bodyJSON, wantErr: "exclude each other"},
		{name: "repeated column", give: "id,amount,amount\n", body: bodyJSON, wantErr: "repeated name"},
		{name: "empty", give: "", body: bodyJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ops, bad, err := readInputAs(strings.NewReader(tt.give), mustURL(t, base), inputSpec{format: formatCSV, body: tt.body})
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantOps, ops)
			assert.Equal(t, tt.wantBad, lineNumbers(bad), "%v", bad)
		})
	}
}

func TestFormFromJSON(t *testing.T) {
	tests := []struct {
		give    string
		want    string
		wantErr string
	}{
		{give: `{"amount":1000,"currency":"usd"}`, want: `amount=1000&currency=usd`},
		{give: `{"metadata":{"order":"o 1"},"capture":false,"x":null}`, want: `capture=false&metadata%5Border%5D=o+1&x=`},
		{give: `{"items":[{"price":"p1"},{"price":"p2"}]}`, want: `items%5B0%5D%5Bprice%5D=p1&items%5B1%5D%5Bprice%5D=p2`},
		{give: `{"amount":1e3}`, want: `amount=1e3`},
		{give: `"amount=1&currency=usd"`, want: `amount=1&currency=usd`},
		{give: `"a=%zz"`, wantErr: "not a form-encoded string"},
		{give: `[1,2]`, wantErr: "want a JSON object"},
		{give: `{"":1}`, wantErr: "empty field name"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			got, err := formFromJSON([]byte(tt.give))
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(got))
		})
	}
}

// CSV with form bodies, end to end: the fake API reads the form, counts
// each charge once, and a rerun sends nothing.
func TestBatchCSVForm(t *testing.T) {
	const n = 8
	srv := newServer(t, idemtest.Faults{Seed: 2, DropResponse: 0.3, MaxPerOperation: 1})
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("id,amount,currency,metadata[operation]\n")
	for i := range n {
		fmt.Fprintf(&b, "%s,%d,usd,%s\n", opID(i), 100+i, opID(i))
	}
	in := filepath.Join(dir, "charges.csv")
	require.NoError(t, os.WriteFile(in, []byte(b.String()), 0o600))
	args := []string{"batch", "-url", srv.URL + "/v1/charges", "-in", in, "-journal", filepath.Join(dir, "j"), "-body-format", "form", "-progress", "none"}

	out := runIn(args...)

	require.Equal(t, exitOK, out.code, out.stderr)
	res := results(t, out.stdout)
	assertComplete(t, res, n)
	assertOnce(t, srv, n)
	assert.Contains(t, string(res[opID(3)].Response), `"amount":103`)
	assert.Equal(t, 2, res[opID(0)].Line, "line 1 is the header")
	again := runIn(args...)
	require.Equal(t, exitOK, again.code, again.stderr)
	assertOnce(t, srv, n)
}

// Issue 15: a CSV file read as JSON Lines gave 1,001 errors and "the other
// lines ran" when none ran. Now auto detection reads it as CSV, and a file
// with not one valid line stops before sending with a message that says so.
func TestBatchWrongFormat(t *testing.T) {
	const n = 1000
	srv := newServer(t, idemtest.Faults{})
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("id,amount,currency,operation\n")
	for i := range n {
		fmt.Fprintf(&b, "%s,%d,usd,%s\n", opID(i), 100+i, opID(i))
	}
	in := filepath.Join(dir, "charges.txt")
	require.NoError(t, os.WriteFile(in, []byte(b.String()), 0o600))
	journal := filepath.Join(dir, "j")

	forced := runIn("batch", "-url", srv.URL+"/v1/charges", "-in", in, "-journal", journal, "-in-format", "jsonl", "-progress", "none")

	assert.Equal(t, exitInput, forced.code, forced.stderr)
	assert.Contains(t, forced.stderr, "none of the 1001 input lines is a valid operation; nothing was sent")
	assert.Contains(t, forced.stderr, "and 981 more malformed lines")
	assert.NotContains(t, forced.stderr, "ran")
	assert.Empty(t, forced.stdout)
	assert.Zero(t, srv.Stats().Requests)
	assert.NoFileExists(t, journal, "nothing was started")

	sniffed := runIn("batch", "-url", srv.URL+"/v1/charges", "-in", in, "-journal", journal, "-progress", "none", "-concurrency", "16")

	require.Equal(t, exitOK, sniffed.code, sniffed.stderr)
	assertOnce(t, srv, n)
}
