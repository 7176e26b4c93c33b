// Command funclen lists the longest functions of the Go module at the
// given directory (default "."): `go run ./hack/funclen -n 10` (also
// `make funclen`). A function's length is the number of lines from its
// `func` keyword to its closing brace, comments and blank lines included,
// so it is never less than what golangci-lint's funlen linter counts
// (.golangci.yml holds every non-test function to 150 lines).
//
// Skipped, as the funlen rule skips them: _test.go files, the test-only
// tree test/, generated files (a "Code generated ... DO NOT EDIT." line,
// the Go convention), nested modules (a directory with its own go.mod,
// such as hack/golangci-lint), testdata, bin and hidden directories.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// funcLen is one function (or method) and its length.
type funcLen struct {
	// Lines is the length in lines, from `func` to the closing brace.
	Lines int
	// Pos is the file (relative to the module root) and line of `func`.
	Pos string
	// Name is the function's name, a method's as Type.Method.
	Name string
}

func main() {
	n := flag.Int("n", 10, "how many functions to list, longest first")
	flag.Usage = func() {
		_, _ = fmt.Fprintf(flag.CommandLine.Output(), "usage: funclen [-n N] [module-dir]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	fns, err := longest(root, *n)
	if err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "funclen: %v\n", err)
		os.Exit(1)
	}
	for _, f := range fns {
		fmt.Printf("%4d %s %s\n", f.Lines, f.Pos, f.Name)
	}
}

// longest returns the n longest non-test, non-generated functions with a
// body under root, longest first (ties by position). It fails when root
// cannot be walked or a Go file does not parse.
func longest(root string, n int) ([]funcLen, error) {
	var all []funcLen
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && skipDir(path, rel, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()).Line, fset.Position(fd.End()).Line
			all = append(all, funcLen{Lines: end - start + 1, Pos: fmt.Sprintf("%s:%d", rel, start), Name: funcName(fd)})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(all, func(a, b funcLen) int { return cmp.Compare(b.Lines, a.Lines) })
	return all[:min(n, len(all))], nil
}

// skipDir reports whether the directory at path (rel to the module root,
// named name) holds no code the funlen rule covers.
func skipDir(path, rel, name string) bool {
	if rel == "test" || name == "testdata" || name == "bin" || name == "vendor" || strings.HasPrefix(name, ".") {
		return true
	}
	_, err := os.Stat(filepath.Join(path, "go.mod"))
	return err == nil // a module of its own
}

// funcName is fd's name, with the receiver's type for a method.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr: // a generic type's method
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
