package rlsyaml_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
)

// TestLoadDirLimits: a directory past its size or its descriptor count is
// refused with the exact error naming the limit, before (size) or while
// (descriptors) its files are parsed; one at the limits loads.
func TestLoadDirLimits(t *testing.T) {
	write := func(dir, name, domain string, n int) int64 {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
		for i := range n {
			fmt.Fprintf(&b, "  - key: k\n    value: v%d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return int64(b.Len())
	}
	dir := t.TempDir()
	size := write(dir, "a.yaml", "a", 3)
	size += write(dir, "b.yaml", "b", 2)
	for _, tc := range []struct {
		name    string
		lim     rlsyaml.Limits
		wantErr string
	}{
		{"at the limits", rlsyaml.Limits{Bytes: size, Descriptors: 5}, ""},
		{"bytes", rlsyaml.Limits{Bytes: size - 1, Descriptors: 5},
			fmt.Sprintf("%s: %d bytes of files: over the limit of %d bytes (TOKENGATE_RUNTIME_MAX_BYTES)", dir, size, size-1)},
		{"descriptors", rlsyaml.Limits{Bytes: size, Descriptors: 4},
			filepath.Join(dir, "b.yaml") + ": 5 descriptors so far: over the limit of 4 descriptors (TOKENGATE_RUNTIME_MAX_DESCRIPTORS)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := rlsyaml.LoadDirLimits(dir, false, tc.lim)
			if tc.wantErr == "" {
				if err != nil || len(ds) != 2 {
					t.Fatalf("got %d domains, %v; want 2", len(ds), err)
				}
				return
			}
			if err == nil || err.Error() != tc.wantErr {
				t.Fatalf("got %v, want %q", err, tc.wantErr)
			}
		})
	}
	// The defaults: 2 MiB and 10,000 descriptors.
	if got := (rlsyaml.Limits{}).WithDefaults(); got.Bytes != 2<<20 || got.Descriptors != 10000 {
		t.Errorf("defaults: got %+v, want 2 MiB and 10000 descriptors", got)
	}
}
