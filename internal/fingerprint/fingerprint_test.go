package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestV0 writes version 0 out: method, path, raw query, body hash.
func TestV0(t *testing.T) {
	body := `{"b":2,"a":1}`
	r := httptest.NewRequest("POST", "/charges?z=1&y=2", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	bodySum := sha256.Sum256([]byte(body))
	want := sha256.Sum256([]byte("POST\x00/charges\x00z=1&y=2\x00" + string(bodySum[:])))
	assert.Equal(t, hex.EncodeToString(want[:]), V0(r, []byte(body)))
	assert.True(t, Older(r, []byte(body), V0(r, []byte(body))))
	assert.NotEqual(t, V0(r, []byte(body)), Current(r, []byte(body)))
}

// TestV1 writes version 1 out: method, path, sorted query, the previous
// canonical form's hash and 'j'.
func TestV1(t *testing.T) {
	body := `{"b":2,"a":{"B":1,"a":0}}`
	r := httptest.NewRequest("POST", "/charges?z=1&y=2", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	form, ok := refCanonicalJSON(nil, []byte(body), nil)
	require.True(t, ok)
	formSum := sha256.Sum256(form)
	want := sha256.Sum256([]byte("POST\x00/charges\x00y=2&z=1\x00" + string(formSum[:]) + "j"))
	assert.Equal(t, hex.EncodeToString(want[:]), V1(r, []byte(body)))
	assert.True(t, Older(r, []byte(body), V1(r, []byte(body))))
	assert.True(t, Older(r, []byte(body), V2(r, []byte(body))))
	assert.False(t, Older(r, []byte(body), Current(r, []byte(body))), "the current version is not an older one")
	assert.NotEqual(t, V1(r, []byte(body)), Current(r, []byte(body)))
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
		`{"Amount":1,"amount":1000,"b":{"K":1,"\u212a":2,"k":3}}`,
		`[{"z":[{"y":1,"x":2}],"a":0},[[{"b":1,"a":2}]]]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		canon, ok := canonicalJSON(nil, in, nil)
		ref, refOK := refCanonicalJSON(nil, in, nil)
		if ok != refOK || !bytes.Equal(canon, ref) {
			t.Fatalf("%q: the previous release's canonicaliser gave %v %q, this one %v %q", in, refOK, ref, ok, canon)
		}
		folded, foldOK := canonicalJSON(nil, in, &jsonCanon{fold: true})
		if foldOK != ok || len(folded) != len(canon) {
			t.Fatalf("%q: folding names changed more than the order", in)
		}
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
			got, ok = canonicalJSON(nil, other, &jsonCanon{fold: true})
			if !ok || !bytes.Equal(got, folded) {
				t.Fatalf("%q and %q canonicalise differently with folded names", in, other)
			}
		}
	})
}

// TestCanonicalJSONMatchesPrevious: with names sorted by their bytes, the
// canonical form is the previous release's, on bodies of every shape,
// nested objects out of order included; the middleware accepts that
// release's fingerprints for the records it stored.
func TestCanonicalJSONMatchesPrevious(t *testing.T) {
	flat, nested := canonBodies()
	for _, give := range []string{
		`{"b":1,"a":{"d":[{"z":1,"y":2},3],"c":null}}`,
		`[[[{"b":1,"a":2}]],{"a":[1,{"c":1,"b":2}]}]`,
		`{"a":1,"a":0,"A":2}`,
		`{"\u00e9":1,"e":2,"\t":3}`,
		string(flat), string(nested),
	} {
		got, ok := canonicalJSON(nil, []byte(give), nil)
		want, wantOK := refCanonicalJSON(nil, []byte(give), nil)
		require.True(t, wantOK)
		require.True(t, ok)
		assert.True(t, bytes.Equal(want, got), "%.60q", give)
	}
}

// TestCanonicalJSONTellsWhatGoTellsApart generates objects with names
// that encoding/json matches to one field without regard to letter case
// (k, K and the Kelvin sign; s, S and the long s), shuffles their
// members, and checks: two bodies with one canonical form decode to the
// same struct (never a replay for a request a Go handler reads another
// way); and a shuffle that keeps the order of members with equal folded
// names keeps the form (a re-encoded retry is still the same request).
// (Checked to fail with names sorted by their bytes: {"K":0,"k":1} and
// {"k":1,"K":0} had one form and decoded to 1 and 0.)
func TestCanonicalJSONTellsWhatGoTellsApart(t *testing.T) {
	type target struct {
		A int `json:"a"`
		K int `json:"k"`
		S int `json:"s"`
	}
	names := []string{"a", "A", "k", "K", "\u212a", "s", "S", "\u017f"}
	seed := time.Now().UnixNano()
	rnd := rand.New(rand.NewPCG(uint64(seed), 0))
	type member struct{ name, value string }
	encode := func(ms []member) []byte {
		var b strings.Builder
		b.WriteByte('{')
		for i, m := range ms {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + m.name + `":` + m.value)
		}
		b.WriteByte('}')
		return []byte(b.String())
	}
	form := func(b []byte) string {
		f, ok := canonicalJSON(nil, b, &jsonCanon{fold: true})
		require.True(t, ok, "%s", b)
		return string(f)
	}
	decode := func(b []byte) target {
		var v target
		require.NoError(t, json.Unmarshal(b, &v))
		return v
	}
	fold := func(name string) string {
		var s string
		require.NoError(t, json.Unmarshal([]byte(`"`+name+`"`), &s))
		return strings.ToUpper(strings.NewReplacer("\u212a", "K", "\u017f", "S").Replace(s))
	}
	for range 5000 {
		ms := make([]member, 1+rnd.IntN(6))
		for i := range ms {
			ms[i] = member{names[rnd.IntN(len(names))], strconv.Itoa(rnd.IntN(3))}
		}
		shuffled := slices.Clone(ms)
		rnd.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		x, y := encode(ms), encode(shuffled)
		if form(x) == form(y) {
			require.Equal(t, decode(x), decode(y), "seed %d: %s and %s share a form", seed, x, y)
		}
		// The members of each folded name, in order: the same in both
		// means the same request to any reader that folds names.
		groups := func(ms []member) map[string][]member {
			g := map[string][]member{}
			for _, m := range ms {
				g[fold(m.name)] = append(g[fold(m.name)], m)
			}
			return g
		}
		if reflect.DeepEqual(groups(ms), groups(shuffled)) {
			require.Equal(t, form(x), form(y), "seed %d: %s and %s keep each name's order", seed, x, y)
		}
	}
}
