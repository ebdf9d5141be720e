// Command releasetool keeps the modules of the idemhttp workspace
// publishable and builds a local module proxy from them. It knows no module
// by name: the modules are the `use` directories of go.work, and a
// "project module" is any of them, so a new nested module is covered once it
// is in go.work. RELEASING.md says when each subcommand runs.
//
//	releasetool [-work go.work] modules         path, directory and tag prefix of each module, in tag order
//	releasetool [-work go.work] check           fail unless the go.mod files are in their publishable form
//	releasetool [-work go.work] bump VERSION    require every project module at VERSION, and point go.work at the tree
//	releasetool [-work go.work] adopt           drop go.mod replaces of project modules, copy LICENSE, bump to the workspace's version
//	releasetool [-work go.work] version         print the version the modules require each other at
//	releasetool [-work go.work] tags VERSION    print the release tags, in the order to push them
//	releasetool [-work go.work] stripsums       delete go.sum lines of project modules (see RELEASING.md)
//	releasetool [-work go.work] proxy -version VERSION -out DIR
//
// The publishable form: no go.mod replaces a project module (a replace in a
// dependency is ignored by its users, and `go install pkg@version` refuses a
// module that has one); every requirement on a project module is at one
// version V; go.work has `replace P V => ./dir` for each such module, so
// that the workspace builds from the tree before V is published (in
// workspace mode the go command still reads the go.mod of a required
// version of a workspace module, and would ask the proxy for it); each
// module lives in the directory its path names (the tag is that directory
// plus the version); and each module has the root's LICENSE (a nested
// module's zip holds only its own directory).
//
// proxy writes a file-based module proxy (go help goproxy:
// DIR/<escaped path>/@v/{list,V.info,V.mod,V.zip}) holding every module at
// VERSION, built from the directories as they are: the .mod file is the
// module's go.mod and the .zip is made with golang.org/x/mod/zip, which
// applies the go command's rules (nested modules and vendor directories
// left out, file names and sizes checked). Build it from a copy of the
// tracked files, as .ci/release-check does, to get what a tag would publish.
//
// It is a module of its own, outside the workspace, so that golang.org/x/mod
// never enters the library's dependencies: run it with GOWORK=off.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

const usage = `usage: releasetool [-work go.work] modules|check|adopt|version|stripsums
       releasetool [-work go.work] bump|tags VERSION
       releasetool [-work go.work] proxy -version VERSION -out DIR`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "releasetool:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("releasetool", flag.ContinueOnError)
	work := fs.String("work", "go.work", "the go.work file that lists the modules")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New(usage)
	}
	ws, err := loadWorkspace(*work)
	if err != nil {
		return err
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	switch cmd {
	case "modules":
		for _, m := range ws.tagOrder() {
			fmt.Fprintf(stdout, "%s %s %s\n", m.path, m.dir, m.tagPrefix())
		}
		return nil
	case "check":
		return ws.check()
	case "version":
		v, err := ws.version()
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, v)
		return nil
	case "bump":
		v, err := versionArg(rest)
		if err != nil {
			return err
		}
		if err := ws.refuseReplaces(); err != nil {
			return err
		}
		return ws.bump(v)
	case "adopt":
		// A module that arrives in the old form requires the root at
		// v0.0.0 with a replace: take the version go.work points at.
		v, err := ws.workVersion()
		if err != nil {
			return err
		}
		if err := ws.dropReplaces(); err != nil {
			return err
		}
		if err := ws.copyLicense(); err != nil {
			return err
		}
		return ws.bump(v)
	case "tags":
		v, err := versionArg(rest)
		if err != nil {
			return err
		}
		for _, m := range ws.tagOrder() {
			fmt.Fprintln(stdout, m.tagPrefix()+v)
		}
		return nil
	case "stripsums":
		return ws.stripSums()
	case "proxy":
		pfs := flag.NewFlagSet("proxy", flag.ContinueOnError)
		version := pfs.String("version", "", "the version to publish every module at")
		out := pfs.String("out", "", "the proxy directory to write")
		if err := pfs.Parse(rest); err != nil {
			return err
		}
		if err := checkVersion(*version); err != nil {
			return err
		}
		if *out == "" {
			return errors.New("proxy: -out is required")
		}
		for _, m := range ws.tagOrder() {
			if err := m.publish(*version, *out); err != nil {
				return fmt.Errorf("proxy %s: %w", m.path, err)
			}
			fmt.Fprintf(stdout, "%s@%s %s\n", m.path, *version, m.dir)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

func versionArg(rest []string) (string, error) {
	if len(rest) != 1 {
		return "", errors.New(usage)
	}
	return rest[0], checkVersion(rest[0])
}

func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
		return fmt.Errorf("version %q is not of the form vX.Y.Z[-pre]", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		// A v2+ version needs a /vN module path: not supported here.
		return fmt.Errorf("version %q: major versions past v1 need /%s module paths", v, m)
	}
	return nil
}

type workspace struct {
	file string // path of go.work
	root string // its directory: the repository root
	wf   *modfile.WorkFile
	mods []*mod // in go.work order
}

type mod struct {
	dir  string // absolute
	rel  string // slash-separated, relative to the workspace root; "." for the root
	path string
	file string // path of go.mod
	mf   *modfile.File
}

func (m *mod) tagPrefix() string {
	if m.rel == "." {
		return ""
	}
	return m.rel + "/"
}

func (m *mod) replaceDir() string {
	if m.rel == "." {
		return "./"
	}
	return "./" + m.rel
}

func loadWorkspace(file string) (*workspace, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork(file, data, nil)
	if err != nil {
		return nil, err
	}
	root, err := filepath.Abs(filepath.Dir(file))
	if err != nil {
		return nil, err
	}
	ws := &workspace{file: file, root: root, wf: wf}
	for _, u := range wf.Use {
		dir := filepath.Join(root, filepath.FromSlash(u.Path))
		if filepath.IsAbs(u.Path) {
			dir = u.Path
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil, fmt.Errorf("%s: module %s is outside the repository", file, u.Path)
		}
		m := &mod{dir: dir, rel: filepath.ToSlash(rel), file: filepath.Join(dir, "go.mod")}
		data, err := os.ReadFile(m.file)
		if err != nil {
			return nil, err
		}
		if m.mf, err = modfile.Parse(m.file, data, nil); err != nil {
			return nil, err
		}
		if m.mf.Module == nil {
			return nil, fmt.Errorf("%s has no module line", m.file)
		}
		m.path = m.mf.Module.Mod.Path
		ws.mods = append(ws.mods, m)
	}
	if len(ws.mods) == 0 {
		return nil, fmt.Errorf("%s uses no module", file)
	}
	return ws, nil
}

func (ws *workspace) project(path string) *mod {
	for _, m := range ws.mods {
		if m.path == path {
			return m
		}
	}
	return nil
}

// tagOrder returns the modules with every module after the project modules
// it requires (go.work order otherwise), so that each tag, when pushed,
// finds the versions it requires already tagged.
func (ws *workspace) tagOrder() []*mod {
	var order []*mod
	done := map[*mod]bool{}
	var visit func(m *mod, depth int)
	visit = func(m *mod, depth int) {
		if done[m] || depth > len(ws.mods) { // depth bound: a requirement cycle
			return
		}
		for _, r := range m.mf.Require {
			if dep := ws.project(r.Mod.Path); dep != nil && dep != m {
				visit(dep, depth+1)
			}
		}
		if !done[m] {
			done[m] = true
			order = append(order, m)
		}
	}
	for _, m := range ws.mods {
		visit(m, 0)
	}
	return order
}

// version returns the one version at which the modules require each other.
func (ws *workspace) version() (string, error) {
	seen := map[string][]string{}
	for _, m := range ws.mods {
		for _, r := range m.mf.Require {
			if ws.project(r.Mod.Path) != nil {
				seen[r.Mod.Version] = append(seen[r.Mod.Version], m.rel+" requires "+r.Mod.Path+" "+r.Mod.Version)
			}
		}
	}
	switch len(seen) {
	case 0:
		return "", errors.New("no module requires another: no workspace version")
	case 1:
		for v := range seen {
			return v, nil
		}
	}
	var lines []string
	for _, l := range seen {
		lines = append(lines, l...)
	}
	slices.Sort(lines)
	return "", fmt.Errorf("project modules are required at different versions (run .ci/release.sh bump VERSION):\n  %s", strings.Join(lines, "\n  "))
}

// workVersion returns the one version at which go.work replaces project
// modules, or else the one version at which they require each other.
func (ws *workspace) workVersion() (string, error) {
	var vs []string
	for _, r := range ws.wf.Replace {
		if ws.project(r.Old.Path) != nil && r.Old.Version != "" && !slices.Contains(vs, r.Old.Version) {
			vs = append(vs, r.Old.Version)
		}
	}
	switch len(vs) {
	case 0:
		return ws.version()
	case 1:
		return vs[0], nil
	}
	return "", fmt.Errorf("go.work replaces project modules at several versions %v: run .ci/release.sh bump VERSION", vs)
}

func (ws *workspace) replacesOfProject() []string {
	var found []string
	for _, m := range ws.mods {
		for _, r := range m.mf.Replace {
			if ws.project(r.Old.Path) != nil {
				found = append(found, fmt.Sprintf("%s/go.mod: replace %s => %s", m.rel, r.Old.Path, r.New.Path))
			}
		}
	}
	return found
}

func (ws *workspace) refuseReplaces() error {
	if found := ws.replacesOfProject(); len(found) > 0 {
		return fmt.Errorf("go.mod files must not replace project modules (go.work joins them; `.ci/release.sh adopt` drops these):\n  %s",
			strings.Join(found, "\n  "))
	}
	return nil
}

func (ws *workspace) check() error {
	var problems []string
	if err := ws.refuseReplaces(); err != nil {
		problems = append(problems, err.Error())
	}
	var rootMod *mod
	for _, m := range ws.mods {
		if m.rel == "." {
			rootMod = m
		}
	}
	license, err := os.ReadFile(filepath.Join(ws.root, "LICENSE"))
	if err != nil {
		problems = append(problems, "no LICENSE at the repository root")
	}
	for _, m := range ws.mods {
		if rootMod != nil && m != rootMod && m.path != path.Join(rootMod.path, m.rel) {
			problems = append(problems, fmt.Sprintf("%s: module path %s does not match its directory (want %s): its tag would not resolve",
				m.rel, m.path, path.Join(rootMod.path, m.rel)))
		}
		if l, err := os.ReadFile(filepath.Join(m.dir, "LICENSE")); license != nil && (err != nil || !bytes.Equal(l, license)) {
			problems = append(problems, fmt.Sprintf("%s: no copy of the root LICENSE (its module zip holds only its own directory): cp LICENSE %s/", m.rel, m.rel))
		}
	}
	v, err := ws.version()
	if err != nil {
		problems = append(problems, err.Error())
	} else {
		for _, want := range ws.wantWorkReplaces(v) {
			if !slices.ContainsFunc(ws.wf.Replace, func(r *modfile.Replace) bool {
				return r.Old == want.Old && r.New == want.New
			}) {
				problems = append(problems, fmt.Sprintf("go.work lacks `replace %s %s => %s` (run .ci/release.sh bump %s)",
					want.Old.Path, want.Old.Version, want.New.Path, v))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New("not in publishable form:\n" + strings.Join(problems, "\n"))
	}
	return nil
}

// wantWorkReplaces lists the go.work replaces that point each required
// project module at version v to its directory.
func (ws *workspace) wantWorkReplaces(v string) []modfile.Replace {
	var out []modfile.Replace
	for _, dep := range ws.mods {
		for _, m := range ws.mods {
			if slices.ContainsFunc(m.mf.Require, func(r *modfile.Require) bool { return r.Mod.Path == dep.path }) {
				out = append(out, modfile.Replace{
					Old: module.Version{Path: dep.path, Version: v},
					New: module.Version{Path: dep.replaceDir()},
				})
				break
			}
		}
	}
	return out
}

func (ws *workspace) dropReplaces() error {
	for _, m := range ws.mods {
		for _, r := range slices.Clone(m.mf.Replace) {
			if ws.project(r.Old.Path) != nil {
				if err := m.mf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
					return err
				}
			}
		}
	}
	return nil // written by bump
}

// copyLicense gives every module the root's LICENSE.
func (ws *workspace) copyLicense() error {
	license, err := os.ReadFile(filepath.Join(ws.root, "LICENSE"))
	if err != nil {
		return err
	}
	for _, m := range ws.mods {
		if err := writeIfChanged(filepath.Join(m.dir, "LICENSE"), license); err != nil {
			return err
		}
	}
	return nil
}

func (ws *workspace) bump(v string) error {
	for _, m := range ws.mods {
		for _, r := range slices.Clone(m.mf.Require) {
			if ws.project(r.Mod.Path) != nil {
				if err := m.mf.AddRequire(r.Mod.Path, v); err != nil {
					return err
				}
			}
		}
		m.mf.Cleanup()
		out, err := m.mf.Format()
		if err != nil {
			return err
		}
		if err := writeIfChanged(m.file, out); err != nil {
			return err
		}
	}
	for _, r := range slices.Clone(ws.wf.Replace) {
		if ws.project(r.Old.Path) != nil {
			if err := ws.wf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	for _, r := range ws.wantWorkReplaces(v) {
		if err := ws.wf.AddReplace(r.Old.Path, r.Old.Version, r.New.Path, ""); err != nil {
			return err
		}
	}
	ws.wf.Cleanup()
	return writeIfChanged(ws.file, modfile.Format(ws.wf.Syntax))
}

func writeIfChanged(name string, data []byte) error {
	old, err := os.ReadFile(name)
	if err == nil && bytes.Equal(old, data) {
		return nil
	}
	return os.WriteFile(name, data, 0o644)
}

func (ws *workspace) stripSums() error {
	for _, m := range ws.mods {
		name := filepath.Join(m.dir, "go.sum")
		data, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		var keep []string
		for _, line := range strings.SplitAfter(string(data), "\n") {
			if f := strings.Fields(line); len(f) > 0 && ws.project(f[0]) != nil {
				continue
			}
			keep = append(keep, line)
		}
		if err := writeIfChanged(name, []byte(strings.Join(keep, ""))); err != nil {
			return err
		}
	}
	return nil
}

// publish writes the module at version into the proxy tree out.
func (m *mod) publish(version, out string) error {
	mv := module.Version{Path: m.path, Version: version}
	if err := module.Check(mv.Path, mv.Version); err != nil {
		return err
	}
	escaped, err := module.EscapePath(mv.Path)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(m.file)
	if err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".info"), info, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".mod"), gomod, 0o644); err != nil {
		return err
	}
	if err := writeZip(filepath.Join(vdir, version+".zip"), mv, m.dir); err != nil {
		return err
	}
	return addToList(filepath.Join(vdir, "list"), version)
}

func writeZip(name string, mv module.Version, dir string) (err error) {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	return modzip.CreateFromDir(f, mv, dir)
}

func addToList(name, version string) error {
	data, err := os.ReadFile(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(data))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(name, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}
