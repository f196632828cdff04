package bench

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestScriptsBuildTheServiceAsShipped: every bench script that builds
// tokengate-rls builds it with the vtprotobuf tag, as the Makefile does
// (docs/rls.md#the-codec). bench/rls.sh and bench/dropin.sh once built it
// without: run on their own (as BENCHMARKS.md says they can be), they
// measured the service answering through proto.Marshal, which no release
// does.
func TestScriptsBuildTheServiceAsShipped(t *testing.T) {
	scripts, err := filepath.Glob("*.sh")
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile(`\bbuild\b.*\./cmd/tokengate-rls\b`)
	found := 0
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") || !build.MatchString(line) {
				continue
			}
			found++
			if !strings.Contains(line, "-tags=vtprotobuf") {
				t.Errorf("%s:%d builds tokengate-rls without -tags=vtprotobuf: %s", s, i+1, strings.TrimSpace(line))
			}
		}
	}
	if found == 0 {
		t.Fatal("no bench script builds ./cmd/tokengate-rls: the check found nothing to check")
	}
}
