package filejournal_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/filejournal"
)

// TestFSDocListsEveryMethod: FS and File are aliases of the internal
// log's interfaces, so go doc shows no method of theirs; their doc
// comments list the methods instead (issue 34 §6: Options.FS pointed a
// user at an internal package). This keeps the lists and the interfaces
// alike: a method added to the log's FS or File, or one renamed, fails
// here until the doc says what it must do. Checked to fail with
// CloseReplaced dropped from File's list.
func TestFSDocListsEveryMethod(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "journal.go", nil, parser.ParseComments)
	require.NoError(t, err)
	docs := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE || g.Doc == nil {
			continue
		}
		for _, s := range g.Specs {
			docs[s.(*ast.TypeSpec).Name.Name] = g.Doc.Text()
		}
	}
	listed := regexp.MustCompile(`(?m)^\t([A-Z]\w*)\(`)
	for name, typ := range map[string]reflect.Type{
		"FS":   reflect.TypeFor[filejournal.FS](),
		"File": reflect.TypeFor[filejournal.File](),
	} {
		var want, got []string
		for i := range typ.NumMethod() {
			want = append(want, typ.Method(i).Name)
		}
		for _, m := range listed.FindAllStringSubmatch(docs[name], -1) {
			got = append(got, m[1])
		}
		slices.Sort(got)
		assert.Equal(t, want, got, "the methods %s's doc lists", name)
	}
}
