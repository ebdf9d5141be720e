package idemtest_test

import (
	"encoding/json"
	"net/url"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemtest"
)

func TestOperation(t *testing.T) {
	tests := []struct {
		name        string
		contentType string
		give        string
		want        string
	}{
		{"json", "application/json", `{"operation":"op-1","amount":5}`, "op-1"},
		{"json with charset", "application/json; charset=utf-8", `{"operation":"op-1"}`, "op-1"},
		{"problem-style json", "application/vnd.api+json", `{"operation":"op-1"}`, "op-1"},
		{"json metadata", "application/json", `{"metadata":{"operation":"op-2"}}`, "op-2"},
		{"json top level wins", "application/json", `{"operation":"top","metadata":{"operation":"meta"}}`, "top"},
		{"json number operation", "application/json", `{"operation":7,"metadata":{"operation":"meta"}}`, "meta"},
		{"json syntax error", "application/json", `{"operation":"op"`, ""},
		{"json array", "application/json", `["operation"]`, ""},
		{"form", "application/x-www-form-urlencoded", "amount=5&operation=op-3", "op-3"},
		{"form metadata like stripe-go", "application/x-www-form-urlencoded", "amount=5&metadata%5Boperation%5D=op-4", "op-4"},
		{"form with a bad pair", "application/x-www-form-urlencoded", "a=%zz&operation=op-5", "op-5"},
		{"sniffed json", "", ` {"operation":"op-6"}`, "op-6"},
		{"sniffed form", "", "operation=op-7", "op-7"},
		{"other type", "text/plain", "operation=op-8", ""},
		{"none", "application/json", `{}`, ""},
		{"unparsable content type is sniffed", "a/b/c;;", "operation=x", "x"},
		{"json metadata not an object", "application/json", `{"metadata":"op"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, idemtest.Operation(tt.contentType, []byte(tt.give)))
		})
	}
}

// FuzzOperation feeds arbitrary content types and bodies to the operation
// extraction: it never panics and always gives the same answer.
func FuzzOperation(f *testing.F) {
	f.Add("application/json", []byte(`{"operation":"op"}`))
	f.Add("application/x-www-form-urlencoded", []byte("metadata%5Boperation%5D=op"))
	f.Add("", []byte(`{"metadata":{"operation":1}}`))
	f.Add("application/json; charset=\"", []byte(`{`))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		require.Equal(t, idemtest.Operation(contentType, body), idemtest.Operation(contentType, body))
	})
}

// FuzzOperationRoundTrip checks that any operation id a client puts in a
// JSON body, a form or form metadata comes back out unchanged.
func FuzzOperationRoundTrip(f *testing.F) {
	f.Add("order-1")
	f.Add("")
	f.Add("a&b=c")
	f.Add(`"quoted" \ slash`)
	f.Add("é✓")
	f.Fuzz(func(t *testing.T, op string) {
		form := url.Values{"operation": {op}}.Encode()
		require.Equal(t, op, idemtest.Operation("application/x-www-form-urlencoded", []byte(form)))
		if op != "" {
			meta := url.Values{"metadata[operation]": {op}}.Encode()
			require.Equal(t, op, idemtest.Operation("application/x-www-form-urlencoded", []byte(meta)))
		}
		if utf8.ValidString(op) { // JSON replaces invalid UTF-8
			b, err := json.Marshal(map[string]string{"operation": op})
			require.NoError(t, err)
			require.Equal(t, op, idemtest.Operation("application/json", b))
			require.Equal(t, op, idemtest.Operation("", b))
		}
	})
}
