// Package docs holds the reference and deployment guides; its test checks
// that the relative links of every Markdown file in the repository resolve.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// linkRE finds inline links and images: [text](target) and ![alt](target).
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// headingRE finds ATX headings.
var headingRE = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$`)

// slug is GitHub's anchor for a heading: lower case, punctuation other than
// '-' and '_' dropped, spaces to '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown document's headings, outside
// fenced code blocks, numbered as GitHub numbers repeats (-1, -2, ...).
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, h := range headingRE.FindAllStringSubmatch(stripFences(doc), -1) {
		text := regexp.MustCompile("[`*]|\\[([^]]*)\\]\\([^)]*\\)").ReplaceAllString(h[1], "$1")
		s := slug(text)
		if n := seen[s]; n > 0 {
			out[s+"-"+itoaSmall(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func itoaSmall(n int) string { return string(rune('0' + n%10)) }

// stripFences blanks fenced code blocks, whose '#' lines are not headings
// and whose brackets are not links.
func stripFences(doc string) string {
	lines := strings.Split(doc, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// brokenLinks returns the relative links of the Markdown file at path
// (with content doc) that do not resolve: a missing file or directory, or
// an #anchor with no heading in the target Markdown file.
func brokenLinks(path, doc string, read func(string) (string, error)) []string {
	var bad []string
	for _, m := range linkRE.FindAllStringSubmatch(stripFences(doc), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		resolved := path
		if file != "" {
			resolved = filepath.Join(filepath.Dir(path), file)
		}
		content, err := read(resolved)
		if err != nil {
			bad = append(bad, target+": "+err.Error())
			continue
		}
		if anchor != "" && strings.HasSuffix(resolved, ".md") && !anchors(content)[anchor] {
			bad = append(bad, target+": no heading with anchor #"+anchor+" in "+resolved)
		}
	}
	return bad
}

func readTarget(p string) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", err
	}
	if fi.IsDir() {
		return "", nil
	}
	b, err := os.ReadFile(p)
	return string(b), err
}

// TestRelativeLinksResolve walks every *.md of the repository.
func TestRelativeLinksResolve(t *testing.T) {
	root := ".."
	n := 0
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "build" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".md") {
			return nil
		}
		n++
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, bad := range brokenLinks(p, string(b), readTarget) {
			t.Errorf("%s: broken link %s", p, bad)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 5 {
		t.Fatalf("found only %d Markdown files under %s", n, root)
	}
}

// TestBrokenLinksAreFound: the checker must fail on each kind of bad link.
func TestBrokenLinksAreFound(t *testing.T) {
	files := map[string]string{
		"a/doc.md":   "# Title\n\n## Some `code` heading\n\n## Twice\n## Twice\n\n```\n# not a heading\n```\n",
		"a/other.go": "package a",
	}
	read := func(p string) (string, error) {
		if c, ok := files[filepath.ToSlash(p)]; ok {
			return c, nil
		}
		return "", os.ErrNotExist
	}
	tests := []struct {
		name, link string
		broken     bool
	}{
		{"file", "other.go", false},
		{"missing file", "gone.md", true},
		{"anchor", "doc.md#some-code-heading", false},
		{"same-file anchor", "#title", false},
		{"repeated heading", "doc.md#twice-1", false},
		{"missing anchor", "doc.md#nope", true},
		{"heading in a code block", "doc.md#not-a-heading", true},
		{"missing same-file anchor", "#nope", true},
		{"absolute URL", "https://example.com/x.md#y", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bad := brokenLinks("a/doc.md", "see [x]("+tc.link+")", read)
			if (len(bad) > 0) != tc.broken {
				t.Errorf("link %q: broken %v (%q), want %v", tc.link, len(bad) > 0, bad, tc.broken)
			}
		})
	}
}
