package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	localproxy "github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestTourStatsGrep (issue 22, item 12): the `/stats | grep` commands the
// README's tour and make cluster's banner print find lines in the real
// /stats of the configuration they are about. Both grepped for the rule
// name ("per-ip"), which the metric names spell with '_'.
func TestTourStatsGrep(t *testing.T) {
	wasm := builtModule(t)
	grep := regexp.MustCompile(`/stats \| grep ([^\s]+)`)
	for _, tc := range []struct{ doc, envoy string }{
		{"../../README.md", "../../envoy.yaml"},
		{"../../tools/cluster.sh", "../../examples/cluster/envoy.yaml"},
	} {
		text, err := os.ReadFile(tc.doc)
		if err != nil {
			t.Fatal(err)
		}
		m := grep.FindSubmatch(text)
		if m == nil {
			t.Fatalf("%s: no `/stats | grep` command", tc.doc)
		}
		pattern := string(m[1])
		lo, _, err := loadPlugin(settings{envoy: tc.envoy})
		if err != nil {
			t.Fatal(err)
		}
		lo.host.Wasm, lo.host.Workers, lo.host.LogSink = wasm, 1, func(wasmhost.LogLevel, string) {}
		lo.proxy.Upstream = nil // the echo upstream; the route's cluster is not running
		h, err := wasmhost.New(context.Background(), lo.host)
		if err != nil {
			t.Fatal(err)
		}
		proxy := httptest.NewServer(localproxy.New(h, lo.proxy))
		resp, err := http.Get(proxy.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		admin := httptest.NewServer(adminHandler(h, false))
		resp, err = http.Get(admin.URL + "/stats")
		if err != nil {
			t.Fatal(err)
		}
		stats, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		admin.Close()
		proxy.Close()
		_ = h.Close(context.Background())
		var matched []string
		for _, line := range strings.Split(string(stats), "\n") {
			if strings.Contains(line, pattern) {
				matched = append(matched, line)
			}
		}
		if len(matched) == 0 {
			t.Errorf("%s: `grep %s` finds nothing in /stats:\n%s", tc.doc, pattern, stats)
		} else {
			t.Logf("%s: grep %s: %q", tc.doc, pattern, matched)
		}
	}
}
