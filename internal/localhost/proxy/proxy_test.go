package proxy

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestTrapAsTheStreamEndsFreesTheWorker: a VM that traps in proxy_on_log,
// after the response is known, answers 503 as Envoy's fail-closed reply
// and leaves its worker usable: the next request on the only worker is
// served by the restarted VM. (Before the proxy was split from the ABI
// host, this path returned with the worker still locked, and the next
// request waited forever.)
func TestTrapAsTheStreamEndsFreesTheWorker(t *testing.T) {
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{})
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(what string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.Header.Set("x-test", what)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("x-test %s: %v", what, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get("sleep-on-log"); got != http.StatusServiceUnavailable {
		t.Fatalf("a trap in proxy_on_log: status %d, want 503", got)
	}
	if got := get("none"); got != http.StatusOK {
		t.Fatalf("the next request: status %d, want 200", got)
	}
	restarted := false
	for _, e := range h.Logs() {
		restarted = restarted || strings.Contains(e.Message, "restarting worker 0")
	}
	if !restarted {
		t.Errorf("no restart in the logs: %v", h.Logs())
	}
}
