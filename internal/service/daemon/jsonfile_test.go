package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/rls"
)

const oneRule = `{"rules": [{"name": "a", "scope": "cluster", "limit_keys": ["ip:address"],
  "algorithm_config": {"tokens_per_second": 1, "burst": 1}}], "settings": {"rls": {"cluster": "rls"}}}`

const twoRules = `{"rules": [{"name": "a", "scope": "cluster", "limit_keys": ["ip:address"],
  "algorithm_config": {"tokens_per_second": 1, "burst": 1}},
  {"name": "b", "scope": "cluster", "limit_keys": ["ip:address"],
  "algorithm_config": {"tokens_per_second": 1, "burst": 1}}], "settings": {"rls": {"cluster": "rls"}}}`

// TestJSONFile steps the JSON file source through the changes a reload
// sees: Poll applies a file whose bytes changed, ignores one touched with
// the same bytes, counts a bad file as a failure (the one in force stays);
// Reload applies whatever the file holds.
func TestJSONFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rls.json")
	write := func(data string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Unix(1736940000, 0)
	write(oneRule, t0)
	f := NewJSONFile(path, slog.New(slog.NewTextHandler(io.Discard, nil)))
	c, err := f.First()
	if err != nil || len(c.Rules()) != 1 {
		t.Fatalf("First: %v rules, %v; want 1 rule", c, err)
	}
	var applied []int // rules of each configuration applied, -1 for a failure
	apply := func(c *rls.Config, err error) {
		if err != nil {
			applied = append(applied, -1)
			return
		}
		applied = append(applied, len(c.Rules()))
	}
	if _, err := f.Follow(t.Context(), apply); err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		name   string
		write  string // "" writes nothing
		at     time.Time
		reload bool
		want   []int
	}{
		{"unchanged", "", time.Time{}, false, nil},
		{"touched, same bytes", oneRule, t0.Add(time.Second), false, nil},
		{"new rules", twoRules, t0.Add(2 * time.Second), false, []int{2}},
		{"bad file", `{"rules": [`, t0.Add(3 * time.Second), false, []int{2, -1}},
		{"bad file, looked at again", "", time.Time{}, false, []int{2, -1}},
		{"SIGHUP with the bad file", "", time.Time{}, true, []int{2, -1, -1}},
		{"fixed", oneRule, t0.Add(4 * time.Second), false, []int{2, -1, -1, 1}},
		{"SIGHUP, nothing changed", "", time.Time{}, true, []int{2, -1, -1, 1, 1}},
	} {
		if step.write != "" {
			write(step.write, step.at)
		}
		if step.reload {
			f.Reload("SIGHUP", apply)
		} else {
			f.Poll(apply)
		}
		if len(applied) != len(step.want) {
			t.Fatalf("step %d (%s): got %v, want %v", i, step.name, applied, step.want)
		}
		for j := range applied {
			if applied[j] != step.want[j] {
				t.Fatalf("step %d (%s): got %v, want %v", i, step.name, applied, step.want)
			}
		}
	}
}
