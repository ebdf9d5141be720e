package idemserver

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
)

func TestParseKey(t *testing.T) {
	tests := []struct {
		name    string
		give    string
		form    KeyForm
		want    string
		wantErr bool
	}{
		{name: "bare", give: "abc-123", want: "abc-123"},
		{name: "quoted", give: `"abc-123"`, want: "abc-123"},
		{name: "quoted with escapes", give: `"a\\b"`, want: `a\b`},
		{name: "inner space", give: "a b", want: "a b"},
		{name: "empty", give: "", wantErr: true},
		{name: "empty quoted", give: `""`, wantErr: true},
		{name: "unterminated", give: `"abc`, wantErr: true},
		{name: "quote inside bare", give: `ab"c`, wantErr: true},
		{name: "control byte", give: "a\x01b", wantErr: true},
		{name: "leading space", give: " abc", wantErr: true},
		{name: "too long", give: strings.Repeat("k", 256), wantErr: true},
		{name: "bare form takes bare", give: "abc", form: KeyFormBare, want: "abc"},
		{name: "bare form refuses quoted", give: `"abc"`, form: KeyFormBare, wantErr: true},
		{name: "quoted form takes quoted", give: `"abc"`, form: KeyFormQuoted, want: "abc"},
		{name: "quoted form refuses bare", give: "abc", form: KeyFormQuoted, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKey(tt.give, tt.form)
			if tt.wantErr {
				assert.ErrorIs(t, err, idemhttp.ErrInvalidKey)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseKey checks the key header handling in every form: it never
// panics, refuses only with ErrInvalidKey, accepts only valid keys, and an
// accepted key written back in the form it came in parses to itself.
func FuzzParseKey(f *testing.F) {
	f.Add("abc")
	f.Add(`"abc"`)
	f.Add(`"a\"b"`)
	f.Add(`"a\\b"`)
	f.Add(`"`)
	f.Add("")
	f.Add(" k ")
	f.Add("k\x00")
	f.Fuzz(func(t *testing.T, v string) {
		for _, form := range []KeyForm{KeyFormAny, KeyFormBare, KeyFormQuoted} {
			key, err := parseKey(v, form)
			if err != nil {
				require.ErrorIs(t, err, idemhttp.ErrInvalidKey)
				continue
			}
			require.NoError(t, contract.ValidateKey(key))
			quoted := strings.HasPrefix(v, `"`)
			if !quoted {
				require.Equal(t, v, key, "a bare key is taken as is")
			}
			back, err := parseKey(contract.FormatKeyHeader(key, quoted), form)
			require.NoError(t, err)
			require.Equal(t, key, back)
		}
	})
}

// FuzzScopedKey checks that joining scope and key is injective: two
// different (scope, key) pairs never share a store key, whatever bytes a
// principal function returns.
func FuzzScopedKey(f *testing.F) {
	f.Add("a", "b:c", "a:b", "c")
	f.Add("", "0::k", "0:", ":k")
	f.Add("1", "x", "1:x", "")
	f.Fuzz(func(t *testing.T, scope1, key1, scope2, key2 string) {
		if scopedKey(scope1, key1) == scopedKey(scope2, key2) {
			require.Equal(t, scope1, scope2)
			require.Equal(t, key1, key2)
		}
	})
}
