package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// conflictMarker reports whether a line is one of git's merge conflict
// markers.
func conflictMarker(line string) bool {
	return line == "=======" || strings.HasPrefix(line, "<<<<<<< ") || strings.HasPrefix(line, ">>>>>>> ")
}

// TestNoConflictMarkers: no source, script, configuration or Markdown file
// of the repository holds a merge conflict marker (a merged branch once
// left one in failures.md, which nothing else noticed).
func TestNoConflictMarkers(t *testing.T) {
	exts := map[string]bool{".go": true, ".md": true, ".lua": true, ".json": true, ".yaml": true, ".yml": true, ".sh": true, ".tpl": true}
	err := filepath.WalkDir("..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == ".git" || n == "build" || n == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if !exts[filepath.Ext(p)] && filepath.Base(p) != "Makefile" {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for n := 1; sc.Scan(); n++ {
			if conflictMarker(sc.Text()) {
				t.Errorf("%s:%d: merge conflict marker %q", p, n, sc.Text())
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestConflictMarkerFound(t *testing.T) {
	for line, want := range map[string]bool{"=======": true, "<<<<<<< HEAD": true, ">>>>>>> branch": true,
		"==== heading": false, "a ======= b": false, "": false} {
		if conflictMarker(line) != want {
			t.Errorf("conflictMarker(%q) = %v", line, !want)
		}
	}
}
