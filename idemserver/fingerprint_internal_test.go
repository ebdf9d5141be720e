package idemserver

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLegacyFingerprintAccepted: a record stored by a release that
// fingerprinted raw bytes still matches its retry after an upgrade.
func TestLegacyFingerprintAccepted(t *testing.T) {
	body := `{"b":2,"a":1}`
	r := httptest.NewRequest("POST", "/charges?z=1&y=2", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	old := legacyFingerprint(r, []byte(body))
	// The old formula, written out: method, path, raw query, body hash.
	bodySum := sha256.Sum256([]byte(body))
	want := sha256.Sum256([]byte("POST\x00/charges\x00z=1&y=2\x00" + string(bodySum[:])))
	require.Equal(t, hex.EncodeToString(want[:]), old)
	require.NotEqual(t, old, DefaultFingerprint(r, []byte(body)))

	store := new(MemoryStore)
	h := (&Middleware{SingleTenant: true, Store: store}).build(nil)
	res, err := store.Claim(t.Context(), scopedKey("", "k1"), Claim{Token: "t", Fingerprint: old, LockTimeout: h.lockTimeout})
	require.NoError(t, err)
	require.Equal(t, Claimed, res.State)
	rec, err := (&Response{Status: 201, Body: []byte("stored")}).MarshalBinary()
	require.NoError(t, err)
	require.NoError(t, store.Complete(t.Context(), scopedKey("", "k1"), "t", rec, h.ttl))

	w := httptest.NewRecorder()
	retry := httptest.NewRequest("POST", "/charges?z=1&y=2", strings.NewReader(body))
	retry.Header.Set("Content-Type", "application/json")
	retry.Header.Set("Idempotency-Key", "k1")
	h.ServeHTTP(w, retry)
	assert.Equal(t, 201, w.Code)
	assert.Equal(t, "stored", w.Body.String())
}

func TestCanonicalJSONRefuses(t *testing.T) {
	for _, give := range []string{
		``, ` `, `{`, `}`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `01`, `1.`, `.5`, `1e`, `-`, `+1`,
		`tru`, `nul`, `"abc`, "\"a\x01\"", `"\x"`, `"\u12"`, `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`,
		"\"\xff\"", `1 2`, `[1]]`, `NaN`, strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1),
	} {
		_, ok := canonicalJSON(nil, []byte(give), nil)
		assert.False(t, ok, "%q", give)
	}
}

func TestCanonicalJSONAccepts(t *testing.T) {
	for _, give := range []string{
		`0`, `-0`, `1.5e+10`, `-1E-2`, `true`, `false`, `null`, `""`, `"é"`, `[]`, `{}`, ` [ ] `,
		`{"":{"":[]}}`, strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth),
	} {
		_, ok := canonicalJSON(nil, []byte(give), nil)
		assert.True(t, ok, "%q", give)
	}
}

// FuzzCanonicalJSON checks the canonicaliser against encoding/json: it
// accepts only valid JSON, accepts all valid JSON of valid UTF-8 without
// \u escapes (those may hold unpaired surrogates, which it refuses), and
// gives a text, its compacted form and its indented form one canonical
// form.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"amount":2000,"currency":"usd","metadata":{"order":"o-1","tags":["a","b"]}}`,
		`{"b":1,"a":[true,false,null,-0.5e3]}`,
		`"\u00e9\ud83d\ude00\n\/"`,
		`[{"z":{},"y":[]},{"a":""}]`,
		`{"a":1,"a":2}`,
		"[1,\n 2 ]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		canon, ok := canonicalJSON(nil, in, nil)
		valid := json.Valid(in)
		if ok && !valid {
			t.Fatalf("accepted invalid JSON %q", in)
		}
		if !ok {
			if valid && utf8.Valid(in) && !bytes.Contains(in, []byte(`\u`)) && len(in) < maxJSONDepth {
				t.Fatalf("refused valid JSON %q", in)
			}
			return
		}
		var compact, indented bytes.Buffer
		require.NoError(t, json.Compact(&compact, in))
		require.NoError(t, json.Indent(&indented, in, "\t", "  "))
		for _, other := range [][]byte{compact.Bytes(), indented.Bytes()} {
			got, ok := canonicalJSON(nil, other, nil)
			if !ok || !bytes.Equal(got, canon) {
				t.Fatalf("%q and %q canonicalise differently", in, other)
			}
		}
	})
}
