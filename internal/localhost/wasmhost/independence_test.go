package wasmhost

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSharesNoCodeWithTheProduct keeps the judge apart from the judged: the
// host must model proxy-wasm hosts from their documentation, so none of the
// product's packages (bucket, sharedstate, filter) may be among its
// dependencies, tests included.
func TestSharesNoCodeWithTheProduct(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, product := range []string{"/bucket", "/sharedstate", "/filter"} {
			if strings.HasPrefix(pkg, "github.com/tokengate/tokengate"+product) {
				t.Errorf("internal/localhost/wasmhost depends on the product package %s", pkg)
			}
		}
	}
}
