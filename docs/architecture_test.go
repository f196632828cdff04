package docs

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

const modulePath = "github.com/tokengate/tokengate"

// archDoc is what docs/architecture.md's "Packages" section says: the
// dependency rule (which layer may import which), its exceptions, and
// each layer's packages in table order with what they are linked into.
type archDoc struct {
	mayImport  map[string][]string        // layer → the layers it may import
	exceptions map[[2]string]bool         // {from, to}
	layerOf    map[string]string          // package → layer
	pos        map[string]int             // package → row index in its layer's table
	linked     map[string]map[string]bool // package → "linked into" labels
	rows       []string                   // packages in document order
	layers     []string                   // layers of the package tables, in order
}

var (
	archHeadingRE = regexp.MustCompile(`^###\s+([^:]+)(?::.*)?$`)
	cellRE        = regexp.MustCompile("`([^`]+)`")
)

// cells splits a Markdown table row into its trimmed cells.
func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(strings.TrimSuffix(line, "|"), "|")
	out := strings.Split(line, "|")
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

// parseArch reads the Packages section of architecture.md.
func parseArch(doc string) (*archDoc, error) {
	a := &archDoc{mayImport: map[string][]string{}, exceptions: map[[2]string]bool{},
		layerOf: map[string]string{}, pos: map[string]int{}, linked: map[string]map[string]bool{}}
	start := strings.Index(doc, "\n## Packages")
	if start < 0 {
		return nil, fmt.Errorf("no \"## Packages\" section")
	}
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var header []string // the current table's header cells
	layer := ""
	for _, line := range strings.Split(section, "\n") {
		if m := archHeadingRE.FindStringSubmatch(line); m != nil {
			layer, header = strings.ToLower(strings.TrimSpace(m[1])), nil
			continue
		}
		if !strings.HasPrefix(strings.TrimSpace(line), "|") {
			header = nil
			continue
		}
		c := cells(line)
		if header == nil {
			header = c
			continue
		}
		if strings.HasPrefix(c[0], "---") {
			continue
		}
		switch strings.Join(header, "|") {
		case "layer|may import":
			var to []string
			if c[1] != "—" && c[1] != "-" {
				for _, l := range strings.Split(c[1], ",") {
					to = append(to, strings.TrimSpace(l))
				}
			}
			a.mayImport[c[0]] = to
		case "from|to|why":
			from, to := cellRE.FindStringSubmatch(c[0]), cellRE.FindStringSubmatch(c[1])
			if from == nil || to == nil {
				return nil, fmt.Errorf("exception row %q: want `from` and `to` packages", line)
			}
			a.exceptions[[2]string{from[1], to[1]}] = true
		case "package|what it owns|linked into":
			m := cellRE.FindStringSubmatch(c[0])
			if m == nil || len(c) != 3 {
				return nil, fmt.Errorf("package row %q: want | `package` | what it owns | linked into |", line)
			}
			pkg := m[1]
			if prev, ok := a.layerOf[pkg]; ok {
				return nil, fmt.Errorf("%s has two rows (layers %q and %q)", pkg, prev, layer)
			}
			if !slices.Contains(a.layers, layer) {
				a.layers = append(a.layers, layer)
			}
			a.layerOf[pkg] = layer
			a.pos[pkg] = len(a.rows)
			a.rows = append(a.rows, pkg)
			a.linked[pkg] = map[string]bool{}
			for _, l := range strings.Split(c[2], ",") {
				a.linked[pkg][strings.TrimSpace(l)] = true
			}
		default:
			return nil, fmt.Errorf("a table with header %q in the Packages section, which the test does not know", header)
		}
	}
	if len(a.mayImport) == 0 || len(a.rows) == 0 {
		return nil, fmt.Errorf("found %d layers in the rule table and %d package rows", len(a.mayImport), len(a.rows))
	}
	for _, l := range a.layers {
		if _, ok := a.mayImport[l]; !ok {
			return nil, fmt.Errorf("the package table under %q is not a layer of the rule table", l)
		}
	}
	for l, to := range a.mayImport {
		for _, t := range append([]string{l}, to...) {
			if !slices.Contains(a.layers, t) {
				return nil, fmt.Errorf("the rule table names layer %q, which has no package table", t)
			}
		}
	}
	return a, nil
}

// allowed says whether from may import to: in its non-test files, or
// (test) in its tests.
func (a *archDoc) allowed(from, to string, test bool) bool {
	lf, lt := a.layerOf[from], a.layerOf[to]
	switch {
	case from == to:
		return test // an external test package imports its own package
	case lf == lt && (test || a.pos[to] < a.pos[from]):
		return true
	case slices.Contains(a.mayImport[lf], lt):
		return true
	case test && lt == "test support":
		return true
	}
	return a.exceptions[[2]string{from, to}]
}

// modPackage is one package of the module as go list describes it.
type modPackage struct {
	imports, testImports []string // module-local, without the module path
}

// local trims the module path, or reports false for another module's
// package.
func local(p string) (string, bool) {
	if p == modulePath {
		return ".", true
	}
	return strings.CutPrefix(p, modulePath+"/")
}

// listModule runs go list over the module, natively and for wasip1 (whose
// build constraints add packages such as bench/primitives and change
// imports), and merges what the two say.
func listModule(t *testing.T) map[string]*modPackage {
	t.Helper()
	pkgs := map[string]*modPackage{}
	for _, env := range [][]string{nil, {"GOOS=wasip1", "GOARCH=wasm"}} {
		cmd := exec.Command("go", "list", "-e", "-f",
			`{{.ImportPath}}|{{join .Imports ","}}|{{join .TestImports ","}},{{join .XTestImports ","}}`, "./...")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %v: %v", env, err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			f := strings.Split(line, "|")
			name, _ := local(f[0])
			p := pkgs[name]
			if p == nil {
				p = &modPackage{}
				pkgs[name] = p
			}
			add := func(dst *[]string, list string) {
				for _, imp := range strings.Split(list, ",") {
					if l, ok := local(imp); ok && !slices.Contains(*dst, l) {
						*dst = append(*dst, l)
					}
				}
			}
			add(&p.imports, f[1])
			add(&p.testImports, f[2])
		}
	}
	return pkgs
}

// linkedInto lists the module-local packages go list -deps names for the
// given main packages.
func linkedInto(t *testing.T, env []string, mains ...string) map[string]bool {
	t.Helper()
	set := map[string]bool{}
	if len(mains) == 0 {
		return set
	}
	args := []string{"list", "-deps", "-f", "{{.ImportPath}}"}
	for _, m := range mains {
		args = append(args, "./"+m)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	for _, p := range strings.Fields(string(out)) {
		if l, ok := local(p); ok {
			set[l] = true
		}
	}
	return set
}

// pendingImports are test imports known to break the rule in code other
// work owns at the moment, as "from → to"; they are logged, not failed,
// and the test fails once one is gone, so the list only shrinks.
var pendingImports = map[string]bool{}

// TestArchitectureTableMatchesGoList: docs/architecture.md's package
// tables name every package of the module once and nothing else, every
// import obeys the dependency rule the page states, and every "linked
// into" of module, service and local host is what go list -deps says.
func TestArchitectureTableMatchesGoList(t *testing.T) {
	doc, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	a, err := parseArch(string(doc))
	if err != nil {
		t.Fatalf("docs/architecture.md: %v", err)
	}
	pkgs := listModule(t)
	if _, ok := pkgs["filter"]; !ok || len(pkgs) < 20 {
		t.Fatalf("go list found %d packages, filter among them: %v", len(pkgs), ok)
	}
	var names []string
	for p := range pkgs {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		if _, ok := a.layerOf[p]; !ok {
			t.Errorf("package %s is not in docs/architecture.md: add a row | `%s` | what it owns | linked into | to the table of its layer (%s)",
				p, p, strings.Join(a.layers, ", "))
		}
	}
	for _, p := range a.rows {
		if _, ok := pkgs[p]; !ok {
			t.Errorf("docs/architecture.md has a row for %s, which is not a package of the module: remove the row or fix its name", p)
		}
	}
	if t.Failed() {
		return // the import check needs every package placed
	}

	used := map[[2]string]bool{}
	pendingSeen := map[string]bool{}
	for _, p := range names {
		for _, q := range pkgs[p].imports {
			if !a.allowed(p, q, false) {
				t.Errorf("%s (layer %s) imports %s (layer %s): docs/architecture.md's rule allows %s only packages above it in its table and the layers %v; change the import, or the rule and say why",
					p, a.layerOf[p], q, a.layerOf[q], a.layerOf[p], a.mayImport[a.layerOf[p]])
			}
			if a.exceptions[[2]string{p, q}] {
				used[[2]string{p, q}] = true
			}
		}
		for _, q := range pkgs[p].testImports {
			if a.allowed(p, q, true) {
				continue
			}
			if key := p + " → " + q; pendingImports[key] {
				pendingSeen[key] = true
				t.Logf("the tests of %s import %s against the rule; pending in another room's work", p, q)
				continue
			}
			t.Errorf("the tests of %s (layer %s) import %s (layer %s): tests may import what their package may, their own layer and test support",
				p, a.layerOf[p], q, a.layerOf[q])
		}
	}
	for e := range a.exceptions {
		if !used[e] {
			t.Errorf("docs/architecture.md lists the exception %s → %s, but %s no longer imports %s: remove the row", e[0], e[1], e[0], e[1])
		}
	}
	for key := range pendingImports {
		if !pendingSeen[key] {
			t.Errorf("pendingImports: %s no longer breaks the rule; delete the entry", key)
		}
	}

	// "linked into": what each program links, by the layer of its main.
	mains := map[string][]string{}
	for _, p := range a.rows {
		if strings.HasPrefix(p, "cmd/") {
			mains[a.layerOf[p]] = append(mains[a.layerOf[p]], p)
		}
	}
	// The module layer has two programs built from the same filter: the
	// proxy-wasm module (for wasip1) and the Envoy dynamic module (native,
	// cgo); each has its own label.
	const dynmodMain = "cmd/tokengate-dynmod"
	var wasmMains []string
	for _, m := range mains["module"] {
		if m != dynmodMain {
			wasmMains = append(wasmMains, m)
		}
	}
	for _, c := range []struct {
		label, layer string
		env          []string
		mains        []string
	}{
		{"module", "module", []string{"GOOS=wasip1", "GOARCH=wasm"}, wasmMains},
		{"dynamic module", "module", []string{"CGO_ENABLED=1"}, []string{dynmodMain}},
		{"service", "service", nil, mains["service"]},
		{"local host", "local host", nil, mains["local host"]},
	} {
		if len(c.mains) == 0 || a.layerOf[c.mains[0]] != c.layer {
			t.Errorf("no cmd/ package for the %s in the %s layer's table", c.label, c.layer)
			continue
		}
		linked := linkedInto(t, c.env, c.mains...)
		for _, p := range a.rows {
			switch says := a.linked[p][c.label]; {
			case linked[p] && !says:
				t.Errorf("%s is linked into the %s (go list -deps %s names it): add %q to its \"linked into\" in docs/architecture.md",
					p, c.label, strings.Join(c.mains, " "), c.label)
			case !linked[p] && says:
				t.Errorf("docs/architecture.md says %s is linked into the %s, but go list -deps %s does not name it: remove %q",
					p, c.label, strings.Join(c.mains, " "), c.label)
			}
		}
	}
}

// TestArchitectureRuleIsEnforced: the checker's rule, on a small page,
// allows and forbids what the page says.
func TestArchitectureRuleIsEnforced(t *testing.T) {
	doc := "# x\n\n## Packages\n\n### The dependency rule\n\n" +
		"| layer | may import |\n|---|---|\n| shared | — |\n| module | shared |\n| service | shared |\n| test support | shared, module |\n\n" +
		"| from | to | why |\n|---|---|---|\n| `svc` | `filter` | a reason |\n\n" +
		"### Shared: both\n\n| package | what it owns | linked into |\n|---|---|---|\n| `bucket` | b | module |\n| `config` | c | module |\n\n" +
		"### Module: m\n\n| package | what it owns | linked into |\n|---|---|---|\n| `filter` | f | module |\n\n" +
		"### Service: s\n\n| package | what it owns | linked into |\n|---|---|---|\n| `rls` | r | service |\n| `svc` | s | service |\n\n" +
		"### Test support: t\n\n| package | what it owns | linked into |\n|---|---|---|\n| `filtertest` | t | tests |\n\n## Next\n"
	a, err := parseArch(doc)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		from, to string
		test     bool
		want     bool
	}{
		{"config", "bucket", false, true},      // above it in its layer
		{"bucket", "config", false, false},     // below it
		{"bucket", "config", true, true},       // tests: the own layer
		{"config", "filter", false, false},     // a higher layer
		{"config", "filter", true, false},      // not from tests either
		{"filter", "config", false, true},      // a layer it may import
		{"rls", "filter", false, false},        // the service never imports filter
		{"svc", "filter", false, true},         // ... but for a listed exception
		{"filter", "filtertest", false, false}, // test support only from tests
		{"filter", "filtertest", true, true},   //
		{"filtertest", "filter", false, true},  // test support may import the module
		{"filtertest", "rls", false, false},    // not a layer the rule lists
		{"filter", "filter", true, true},       // an external test package
		{"rls", "svc", false, false},           // svc is below rls
	}
	for _, tc := range tests {
		if got := a.allowed(tc.from, tc.to, tc.test); got != tc.want {
			t.Errorf("%s → %s (test %v): got %v, want %v", tc.from, tc.to, tc.test, got, tc.want)
		}
	}
	for _, bad := range []string{
		strings.Replace(doc, "| `config` | c | module |", "| `bucket` | c | module |", 1),       // two rows
		strings.Replace(doc, "| test support | shared, module |", "| test support | gone |", 1), // unknown layer
		strings.Replace(doc, "| package | what it owns | linked into |\n|---|---|---|\n| `filter`", "| pkg | what |\n|---|---|\n| `filter`", 1),
	} {
		if _, err := parseArch(bad); err == nil {
			t.Errorf("parseArch accepted a broken page:\n%s", bad)
		}
	}
}
