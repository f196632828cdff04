package e2e

import "testing"

// maxModuleBytes is the module's size budget: 3 MiB. Envoy copies the
// module to every worker and Istio pulls it into every pod; the hand-made
// replacements of library code (internal/guest/lite/README.md) and the build's
// -ldflags='-s -w' (no wasm name section: a trap trace in Envoy's log then
// shows function indexes instead of names; build without the flags to
// debug one) keep it under this.
const maxModuleBytes = 3 << 20

// TestModuleSize fails when the module, as built from this tree, is over
// its budget.
func TestModuleSize(t *testing.T) {
	wasm := loadModule(t)
	if len(wasm) > maxModuleBytes {
		t.Errorf("the module is %d bytes, over the %d-byte budget by %d", len(wasm), maxModuleBytes, len(wasm)-maxModuleBytes)
	}
	t.Logf("module: %d bytes, %d under the budget", len(wasm), maxModuleBytes-len(wasm))
}
