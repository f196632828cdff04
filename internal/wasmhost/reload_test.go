package wasmhost

import (
	"strings"
	"testing"
)

// TestReconfigure: every worker's root context reads the new plugin
// configuration through proxy_on_configure; one the guest refuses is
// reported, naming the workers.
func TestReconfigure(t *testing.T) {
	h, srv := newGuestHost(t, Options{Workers: 2, PluginConfig: []byte("cfg-1")})
	if err := h.Reconfigure([]byte("cfg-2")); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // both workers, round robin
		if got := test(t, srv, "config").header.Get("X-Result"); !strings.HasPrefix(got, "cfg-2,") {
			t.Errorf("request %d: x-result %q, want the new configuration", i, got)
		}
	}
	err := h.Reconfigure([]byte("fail"))
	if err == nil || !strings.Contains(err.Error(), "workers [0 1] refused the configuration") {
		t.Errorf("got %v, want both workers refusing", err)
	}
}
