//go:build ignore

// fpgen prints idemserver.DefaultFingerprint of the requests read from
// standard input, one per line: name, method, target, Content-Type and
// body, tab-separated, the last three Go-quoted (the first five columns of
// ../fingerprint.golden). It prints each request's name and fingerprint.
//
// It made the golden file's columns: copied into a git worktree of the
// commit whose fingerprints a column holds and run there from the
// repository's root, as
//
//	cut -f1-5 internal/fingerprint/testdata/fingerprint.golden | grep -v '^#' |
//		go run ./fpgen.go
//
// (version 1: commit 2d053bb; version 2: commit d3b5e13; version 3: the
// commit that added the column). It uses nothing but DefaultFingerprint,
// which every release has, so that it runs unchanged in each.
package main

import (
	"bufio"
	"fmt"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"

	"github.com/idemkit/idemhttp/idemserver"
)

func main() {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) < 5 {
			continue
		}
		var q [3]string
		for i := range q {
			var err error
			if q[i], err = strconv.Unquote(f[2+i]); err != nil {
				fmt.Fprintln(os.Stderr, f[0], err)
				os.Exit(1)
			}
		}
		r := httptest.NewRequest(f[1], q[0], strings.NewReader(q[2]))
		if q[1] != "" {
			r.Header.Set("Content-Type", q[1])
		}
		fmt.Printf("%s\t%s\n", f[0], idemserver.DefaultFingerprint(r, []byte(q[2])))
	}
}
