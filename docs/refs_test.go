package docs

import (
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// A reference is a repository path named in prose: a Go comment or a
// Markdown file. Two kinds are checked.
//
//   - A path with a slash, `internal/localhost/proxy/proxy.go`,
//     `docs/lease.md`, `internal/guest/` or `filter/abi`: it must name a
//     file or directory, from the repository's root or from the directory
//     of the file that names it (a Go comment's `testdata/guest`, a
//     document's `../RATIONALE.md`). One whose first segment is not a
//     directory of the repository and that has no file extension is not a
//     path (`tokens/s`, `allow/deny`).
//   - A bare file name such as `README.md`: in a Go comment it is a
//     file of the commenting file's own directory or of one above it; in a
//     document, of the root or anywhere in the repository (documents name
//     files of several packages by their base name).
//
// Paths of other repositories are allowed only as listed in externalRefs,
// and only on a line that names their repository, so that a reader can
// tell them apart.

// refRE finds path-like words: segments joined by '/', or a bare name with
// a file extension the repository uses.
var refRE = regexp.MustCompile(`(?:^|[^A-Za-z0-9_.\-/:@$<>{}*~+=])((?:\.\./|\./)*(?:[A-Za-z0-9_][A-Za-z0-9_.\-]*/)+[A-Za-z0-9_.\-]*|[A-Za-z0-9][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*\.(?:go|md|lua|sh|mjs|proto|tpl)\b)`)

// fileExts are the extensions that make a slashed word a file path even
// when its first segment is not one of the repository's directories.
var fileExts = map[string]bool{".golden": true, ".go": true, ".md": true, ".lua": true, ".sh": true, ".mjs": true,
	".js": true, ".proto": true, ".tpl": true, ".yaml": true, ".yml": true, ".json": true}

// externalRefs are the paths of other repositories (and names that look
// like paths but are not, such as the Deployments kubectl names) the prose names,
// each with a regular expression for the repository or tool that the line
// naming it, or one of the two lines on either side, must also name.
var externalRefs = map[string]string{
	"envoy/service/ratelimit/v3/rls.proto":                 `Envoy|envoyproxy|go-control-plane`,
	"envoy/extensions/common/ratelimit/v3/ratelimit.proto": `Envoy|envoyproxy|go-control-plane`,
	"rlqs.proto":                `Envoy`,
	"rls_vtproto.pb.go":         `go-control-plane`,
	"server_impl.go":            `envoyproxy/ratelimit`,
	"src/config/config_impl.go": `envoyproxy/ratelimit`,
	"test/integration/runtime/current/ratelimit/config/share_threshold.yaml": `envoyproxy/ratelimit`,
	"test/config/duplicate_key.yaml":                                         `envoyproxy/ratelimit`,
	"test/config/share_threshold.yaml":                                       `envoyproxy/ratelimit`,
	"proxywasm/proxytest/wasmwrapper.go":                                     `proxy-wasm-go-sdk`,
	"internal/sync":                                                          `net/netip`,
	"deploy/envoy-gateway":                                                   `kubectl`,
	"deploy/envoy-ratelimit":                                                 `kubectl`,
	"deploy/tokengate-rls":                                                   `kubectl`,
}

// pendingOtherRooms are references known to dangle in files that other
// work owns at the moment (filter/, config/, rlscontract/ and the
// service), as "file: reference". They are reported, not failed, and
// TestPendingStillDangle fails once one is fixed, so the list only
// shrinks; it is to be empty.
var pendingOtherRooms = map[string]bool{
	"filter/filter_test.go: testdata/name.golden": true,
	"filter/lease_tick.go: lease.lua":             true,
	"rlscontract/descriptor.go: settle.lua":       true,
}

// generated are the paths a build creates; they need not exist in a clean
// clone.
func generated(p string) bool {
	return p == "build" || strings.HasPrefix(p, "build/") || strings.HasPrefix(p, "deploy/build/")
}

// tree is the repository's files and directories, by slash path from the
// root, and its files by base name.
type tree struct {
	paths map[string]bool
	bases map[string]bool
	top   map[string]bool // the root's directories
}

func loadTree(t *testing.T, root string) *tree {
	t.Helper()
	tr := &tree{paths: map[string]bool{}, bases: map[string]bool{}, top: map[string]bool{}}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "build" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if rel == "." {
			return nil
		}
		tr.paths[rel] = true
		if d.IsDir() && !strings.Contains(rel, "/") {
			tr.top[rel] = true
		}
		if !d.IsDir() {
			tr.bases[d.Name()] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// exists reports whether p names something from the root or from dir.
func (tr *tree) exists(dir, p string) bool {
	p = strings.TrimSuffix(p, "/")
	for _, c := range []string{path.Clean(p), path.Clean(path.Join(dir, p))} {
		if tr.paths[c] || generated(c) {
			return true
		}
	}
	return false
}

// danglingRefs returns the references of line i of the prose lines of
// the file at rel (a slash path from the root) that name nothing;
// goComment says whether the lines are a Go file's comments.
func (tr *tree) danglingRefs(rel string, lines []string, i int, goComment bool) []string {
	var bad []string
	dir := path.Dir(rel)
	line := lines[i]
	for _, m := range refRE.FindAllStringSubmatchIndex(line, -1) {
		ref := strings.TrimRight(line[m[2]:m[3]], ".")
		if ref == "" || ref == "/" {
			continue
		}
		ref = strings.TrimPrefix(ref, "github.com/tokengate/tokengate/")
		if marker, ok := externalRefs[ref]; ok && namedNear(lines, i, m[2], m[3], marker) {
			continue
		}
		if !strings.Contains(ref, "/") {
			// A bare file name.
			if tr.paths[ref] || (!goComment && tr.bases[ref]) {
				continue
			}
			found := false
			for d := dir; !found; d = path.Dir(d) {
				found = tr.paths[path.Join(d, ref)]
				if d == "." || d == "/" {
					break
				}
			}
			if !found {
				bad = append(bad, ref)
			}
			continue
		}
		if j := strings.LastIndex(ref, "/"); j >= 0 {
			// pkg/path.Symbol names a Go package's exported name: the
			// package is the path.
			if k := strings.Index(ref[j:], "."); k > 0 && j+k+1 < len(ref) && 'A' <= ref[j+k+1] && ref[j+k+1] <= 'Z' {
				ref = ref[:j+k]
			}
		}
		first, _, _ := strings.Cut(strings.TrimLeft(ref, "./"), "/")
		isPath := tr.top[first] || strings.HasPrefix(ref, "../") || strings.HasPrefix(ref, "./") ||
			fileExts[path.Ext(ref)] || tr.paths[path.Join(dir, first)]
		if !isPath || tr.exists(dir, ref) {
			continue
		}
		bad = append(bad, ref)
	}
	return bad
}

// namedNear reports whether marker matches line i outside [from, to) (the
// reference itself) or one of the two lines on either side.
func namedNear(lines []string, i, from, to int, marker string) bool {
	re := regexp.MustCompile(marker)
	if re.MatchString(lines[i][:from]) || re.MatchString(lines[i][to:]) {
		return true
	}
	for j := max(0, i-2); j <= min(len(lines)-1, i+2); j++ {
		if j != i && re.MatchString(lines[j]) {
			return true
		}
	}
	return false
}

// proseLines returns the lines of prose of a file: every line of a
// Markdown file outside URLs, every comment line of a Go file.
func proseLines(t *testing.T, fset *token.FileSet, p string) (lines []string, nums []int, goFile bool) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(p, ".md") {
		for i, l := range strings.Split(string(b), "\n") {
			lines, nums = append(lines, stripURLs(l)), append(nums, i+1)
		}
		return lines, nums, false
	}
	f, err := parser.ParseFile(fset, p, b, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			start := fset.Position(c.Slash).Line
			for i, l := range strings.Split(c.Text, "\n") {
				lines, nums = append(lines, stripURLs(l)), append(nums, start+i)
			}
		}
	}
	return lines, nums, true
}

// urlRE finds URLs and host-named paths (github.com/…, pkg.go.dev/…),
// which name other sites, not this repository; the module's own import
// paths are kept.
var urlRE = regexp.MustCompile(`[a-z][a-z0-9+.\-]*://\S+|\b(?:[a-z0-9\-]+\.)+(?:com|org|io|dev|net|sh)/\S*`)

func stripURLs(l string) string {
	return urlRE.ReplaceAllStringFunc(l, func(u string) string {
		if strings.HasPrefix(u, "github.com/tokengate/tokengate/") {
			return u
		}
		return strings.Repeat(" ", len(u))
	})
}

// TestNoDanglingReferences: every repository path named in a Go comment
// or a Markdown file exists. A comment that names a file deleted or moved
// (as six comments in filter/ did after its lease file was split) leads a
// reader nowhere.
func TestNoDanglingReferences(t *testing.T) {
	root := ".."
	tr := loadTree(t, root)
	fset := token.NewFileSet()
	var files []string
	for p := range tr.paths {
		if (strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".md")) && !strings.Contains(p, "/testdata/") {
			files = append(files, p)
		}
	}
	sort.Strings(files)
	if len(files) < 100 {
		t.Fatalf("found only %d Go and Markdown files", len(files))
	}
	for _, rel := range files {
		lines, nums, goFile := proseLines(t, fset, filepath.Join(root, filepath.FromSlash(rel)))
		for i := range lines {
			for _, ref := range tr.danglingRefs(rel, lines, i, goFile) {
				if pendingOtherRooms[rel+": "+ref] {
					t.Logf("%s:%d: %q names nothing; pending in another room's work", rel, nums[i], ref)
					continue
				}
				t.Errorf("%s:%d: %q names no file or directory of the repository (fix the path; a path of another repository goes in externalRefs, with that repository named on the line)", rel, nums[i], ref)
			}
		}
	}
}

// TestDanglingReferencesAreFound: the checker finds each kind of bad
// reference and accepts the good ones.
func TestDanglingReferencesAreFound(t *testing.T) {
	tr := &tree{
		paths: map[string]bool{"filter": true, "filter/pipeline.go": true, "filter/abi": true, "docs": true,
			"docs/lease.md": true, "RATIONALE.md": true, "filter/testdata": true, "filter/testdata/x.json": true},
		bases: map[string]bool{"pipeline.go": true, "lease.md": true, "RATIONALE.md": true, "x.json": true},
		top:   map[string]bool{"filter": true, "docs": true},
	}
	tests := []struct {
		file, line string
		goComment  bool
		bad        []string
	}{
		{"filter/stage.go", "see filter/pipeline.go and filter/abi/", true, nil},
		{"filter/stage.go", "see filter/lease.go", true, []string{"filter/lease.go"}},
		{"filter/stage.go", "the table in pipeline.go", true, nil},
		{"filter/stage.go", "the call in lease.go", true, []string{"lease.go"}},
		{"filter/stage.go", "the golden files in testdata/x.json", true, nil},
		{"filter/stage.go", "Envoy's source/common/http/utility.cc", true, nil},
		{"filter/stage.go", "upstream's src/config/config_impl.go", true, []string{"src/config/config_impl.go"}},
		{"filter/stage.go", "envoyproxy/ratelimit's src/config/config_impl.go", true, nil},
		{"filter/stage.go", "github.com/tokengate/tokengate/filter/abi", true, nil},
		{"filter/stage.go", "github.com/tokengate/tokengate/filter/gone", true, []string{"filter/gone"}},
		{"filter/stage.go", "tokens/s, allow/deny", true, nil},
		{"filter/stage.go", "see filter/abi.Export and testdata/name.golden", true, []string{"testdata/name.golden"}},
		{"filter/stage.go", "files ending in _test.go", true, nil},
		{"filter/stage.go", "settings.rls.protocol and google.protobuf.Struct", true, nil},
		{"docs/x.md", "[x](../RATIONALE.md) and docs/lease.md", false, nil},
		{"docs/x.md", "see `pipeline.go`", false, nil},
		{"docs/x.md", "see `docs/gone.md`", false, []string{"docs/gone.md"}},
		{"docs/x.md", "the module in build/tokengate.wasm", false, nil},
		{"docs/x.md", stripURLs("https://github.com/envoyproxy/envoy/blob/main/source/x.cc"), false, nil},
	}
	for _, tc := range tests {
		got := tr.danglingRefs(tc.file, []string{tc.line}, 0, tc.goComment)
		if strings.Join(got, ",") != strings.Join(tc.bad, ",") {
			t.Errorf("%s: %q: got %q, want %q", tc.file, tc.line, got, tc.bad)
		}
	}
}

// TestPendingStillDangle keeps pendingOtherRooms honest: an entry whose
// reference now resolves (or whose file is gone) must be deleted.
func TestPendingStillDangle(t *testing.T) {
	tr := loadTree(t, "..")
	fset := token.NewFileSet()
	for entry := range pendingOtherRooms {
		rel, ref, _ := strings.Cut(entry, ": ")
		if !tr.paths[rel] {
			t.Errorf("pendingOtherRooms: %s: no such file; delete the entry", entry)
			continue
		}
		lines, _, goFile := proseLines(t, fset, filepath.Join("..", filepath.FromSlash(rel)))
		found := false
		for i := range lines {
			found = found || slices.Contains(tr.danglingRefs(rel, lines, i, goFile), ref)
		}
		if !found {
			t.Errorf("pendingOtherRooms: %s resolves now; delete the entry", entry)
		}
	}
}
