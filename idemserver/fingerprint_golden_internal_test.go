package idemserver

import (
	"bufio"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFingerprintGolden compares, for the requests in
// testdata/fingerprint.golden (FuzzCanonicalJSON's seeds and corpus,
// string escapes and surrogates, numbers, duplicate and case-folded
// names, nesting around the depth limit, form bodies, media types and
// queries), previousFingerprint with the fingerprint the release at commit
// 5bbe02fcf680b2ea72df06929351b7bf69d8ab9e computed, and DefaultFingerprint
// with this release's. Unlike TestCanonicalJSONMatchesPrevious, whose
// oracle shares the lexical parts of the canonicaliser under test, these
// cannot follow a change to the code: the previous release's column was
// generated once, by a program printing DefaultFingerprint of each request,
// run (go run) in a git worktree of that commit, and the current column by
// the same program in this tree (the two outputs' requests diffed
// first). Checked to fail with the canonicaliser altered: number literals
// stored without their first byte (24 cases failed, in both columns), and
// the escape \b decoded as \f (the two escape cases failed, in both
// columns, while TestCanonicalJSONMatchesPrevious passed).
func TestFingerprintGolden(t *testing.T) {
	f, err := os.Open("testdata/fingerprint.golden")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		require.Len(t, fields, 7, "%.80s", line)
		name, method := fields[0], fields[1]
		var quoted [3]string // target, Content-Type, body
		for i := range quoted {
			quoted[i], err = strconv.Unquote(fields[2+i])
			require.NoError(t, err, "%s: field %d", name, 2+i)
		}
		target, ct, body := quoted[0], quoted[1], []byte(quoted[2])
		wantPrevious, wantCurrent := fields[5], fields[6]
		r := httptest.NewRequest(method, target, strings.NewReader(string(body)))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		assert.Equal(t, wantPrevious, previousFingerprint(r, body), "%s: the previous release's fingerprint", name)
		assert.Equal(t, wantCurrent, DefaultFingerprint(r, body), "%s: DefaultFingerprint", name)
		n++
	}
	require.NoError(t, sc.Err())
	require.Greater(t, n, 40, "cases read")
}
