// Command apicount counts the exported identifiers of one Go package
// directory (non-test files): types, functions, variables, constants,
// methods (interface methods included) and struct fields, the measure of a
// package's surface used by issue 23.
//
//	go run ./.ci/apicount .            # the total
//	go run ./.ci/apicount -v .         # every identifier, one a line
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"sort"
	"strings"
)

func main() {
	verbose := flag.Bool("v", false, "list every identifier")
	flag.Parse()
	dir := "."
	if flag.NArg() > 0 {
		dir = flag.Arg(0)
	}
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var names []string
	add := func(kind, name string) { names = append(names, kind+" "+name) }
	for _, pkg := range pkgs {
		if strings.HasSuffix(pkg.Name, "_test") {
			continue
		}
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					if d.Recv == nil {
						add("func", d.Name.Name)
						continue
					}
					recv := recvName(d.Recv.List[0].Type)
					if ast.IsExported(recv) {
						add("method", recv+"."+d.Name.Name)
					}
				case *ast.GenDecl:
					for _, s := range d.Specs {
						switch s := s.(type) {
						case *ast.ValueSpec:
							for _, n := range s.Names {
								if n.IsExported() {
									add(strings.ToLower(d.Tok.String()), n.Name)
								}
							}
						case *ast.TypeSpec:
							if !s.Name.IsExported() {
								continue
							}
							add("type", s.Name.Name)
							switch t := s.Type.(type) {
							case *ast.StructType:
								for _, fl := range t.Fields.List {
									if len(fl.Names) == 0 {
										if n := recvName(fl.Type); ast.IsExported(n) {
											add("field", s.Name.Name+"."+n)
										}
									}
									for _, n := range fl.Names {
										if n.IsExported() {
											add("field", s.Name.Name+"."+n.Name)
										}
									}
								}
							case *ast.InterfaceType:
								for _, m := range t.Methods.List {
									for _, n := range m.Names {
										if n.IsExported() {
											add("method", s.Name.Name+"."+n.Name)
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	sort.Strings(names)
	if *verbose {
		for _, n := range names {
			fmt.Println(n)
		}
	}
	fmt.Println(len(names))
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.SelectorExpr:
		return t.Sel.Name
	}
	return ""
}
