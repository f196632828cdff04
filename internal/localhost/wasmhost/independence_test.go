package wasmhost

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/tokengate/tokengate"

// goList runs `go list` with extra environment and returns its output's
// fields.
func goList(t *testing.T, env []string, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Fields(string(out))
}

// productPackages is every package of this repository the proxy-wasm
// module is built from: what `go list -deps` names for ./cmd/tokengate
// under GOOS=wasip1 GOARCH=wasm, computed, so that a package the module
// starts to link is banned from the judges at once.
func productPackages(t *testing.T) map[string]bool {
	t.Helper()
	set := map[string]bool{}
	for _, p := range goList(t, []string{"GOOS=wasip1", "GOARCH=wasm"},
		"-deps", "-f", "{{.ImportPath}}", modulePath+"/cmd/tokengate") {
		if p == modulePath || strings.HasPrefix(p, modulePath+"/") {
			set[p] = true
		}
	}
	// The computed set cannot be empty or miss the filter itself: a
	// broken go list would otherwise ban nothing.
	for _, must := range []string{modulePath + "/cmd/tokengate", modulePath + "/filter", modulePath + "/filter/abi", modulePath + "/bucket"} {
		if !set[must] {
			t.Fatalf("the module's packages as go list computes them lack %s: %v", must, set)
		}
	}
	return set
}

// deps lists the module-local packages pattern links, its tests included
// (go list -deps -test), stripped of the test variants' " [x.test]" tails.
func deps(t *testing.T, pattern string) []string {
	t.Helper()
	var out []string
	for _, p := range goList(t, nil, "-deps", "-test", "-f", "{{.ImportPath}}", pattern) {
		if p == modulePath || strings.HasPrefix(p, modulePath+"/") {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// TestSharesNoCodeWithTheProduct keeps the judges apart from the judged:
// the hosts that run the module in tests model proxy-wasm hosts from their
// documentation, so no package the module is built from may be among their
// dependencies, tests included. The judges are the local host (the ABI
// host in this package, the HTTP proxy internal/localhost/proxy and the
// Envoy configuration reader in internal/localhost/envoyconf) and the V8
// host's driver, e2e/v8.
func TestSharesNoCodeWithTheProduct(t *testing.T) {
	product := productPackages(t)
	for _, judge := range []string{modulePath + "/internal/localhost/...", modulePath + "/e2e/v8"} {
		for _, p := range deps(t, judge) {
			if product[p] {
				t.Errorf("%s depends on %s, a package the module is built from; a host that judges the module must not share its code", judge, p)
			}
		}
	}
}

// TestLocalCommandLinksOnlyTheParser allows cmd/tokengate-local one
// product package, config, which it uses to name the rules in its admin
// page's shared-data listing and to print config.Warnings after -check:
// the module's own reading of a configuration, shown to the user, never
// used to judge the module. Every other package of the module (filter,
// filter/abi, rlscontract, ratelimitheader, cmd/tokengate, …) is banned,
// and config may bring in only what config itself is built from.
func TestLocalCommandLinksOnlyTheParser(t *testing.T) {
	product := productPackages(t)
	allowed := map[string]bool{}
	for _, p := range goList(t, nil, "-deps", "-f", "{{.ImportPath}}", modulePath+"/config") {
		allowed[p] = true
	}
	if !allowed[modulePath+"/config"] || allowed[modulePath+"/filter"] {
		t.Fatalf("config's dependencies as computed are wrong: %v", allowed)
	}
	for _, p := range deps(t, modulePath+"/cmd/tokengate-local") {
		if product[p] && !allowed[p] {
			t.Errorf("cmd/tokengate-local depends on %s, a package the module is built from (only config and its dependencies are allowed)", p)
		}
	}
}
