package contract

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateKey(t *testing.T) {
	tests := []struct {
		give    string
		wantErr bool
	}{
		{"a", false},
		{"550e8400-e29b-41d4-a716-446655440000", false},
		{"order 42", false},
		{`back\slash`, false},
		{strings.Repeat("k", 255), false},
		{"", true},
		{strings.Repeat("k", 256), true},
		{`has"quote`, true},
		{"tab\there", true},
		{"nl\n", true},
		{"del\x7f", true},
		{"café", true},
		{" lead", true},
		{"trail ", true},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			err := ValidateKey(tt.give)
			if tt.wantErr {
				assert.ErrorIs(t, err, ErrInvalidKey)
			} else {
				assert.NoError(t, err)
			}
		})
	}
}

func TestKeyHeaderForms(t *testing.T) {
	tests := []struct {
		give    string
		want    string
		wantErr bool
	}{
		{"abc", "abc", false},
		{`"abc"`, "abc", false},
		{`"a\"b"`, `a"b`, true}, // a quote is never a valid key, escaped or not
		{`"a\\b"`, `a\b`, false},
		{`"abc`, "", true},
		{`""`, "", true},
		{`"`, "", true},
		{`"a\b"`, "", true},
		{`"a"b"`, "", true},
		{"bad\x00", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			got, err := ParseKeyHeader(tt.give)
			if tt.wantErr {
				assert.ErrorIs(t, err, ErrInvalidKey)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
	assert.Equal(t, `"a\\b"`, FormatKeyHeader(`a\b`, true))
	assert.Equal(t, `a\b`, FormatKeyHeader(`a\b`, false))
}

func FuzzParseKeyHeader(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\\b"`, `"a\"b"`, `"`, "", " x", strings.Repeat("k", 256), "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := ParseKeyHeader(v)
		if err != nil {
			return
		}
		// Whatever parses is a valid key, and both wire forms carry it back.
		if verr := ValidateKey(k); verr != nil {
			t.Fatalf("ParseKeyHeader(%q) = %q, which ValidateKey refuses: %v", v, k, verr)
		}
		for _, quoted := range []bool{false, true} {
			back, err := ParseKeyHeader(FormatKeyHeader(k, quoted))
			if err != nil || back != k {
				t.Fatalf("round trip of %q (quoted=%v) = %q, %v", k, quoted, back, err)
			}
		}
	})
}
