package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestInvalidConfig: the host refuses to start a plugin whose configuration
// the filter rejects, and both its error and the filter's error-level log
// line carry the filter's exact message.
func TestInvalidConfig(t *testing.T) {
	tests := []struct {
		name        string
		config      string
		expectedErr string
	}{
		{
			name:        "burst below rate",
			config:      `{"name":"r","algorithm_config":{"tokens_per_second":100,"burst":50}}`,
			expectedErr: "algorithm_config.burst: must be >= tokens_per_second (100), got 50",
		},
		{
			name:        "burst below rps alias",
			config:      `{"rules":[{"name":"a","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":5}}]}`,
			expectedErr: "rules[0].algorithm_config.burst: must be >= rps (10), got 5",
		},
		{
			name:   "unknown descriptor",
			config: `{"rules":[{"name":"a","limit_keys":["cookie:x"],"algorithm_config":{"rps":10,"burst":10}}]}`,
			expectedErr: `rules[0].limit_keys[0]: invalid descriptor "cookie:x" (want ip:address, header:<name>, query:<name>, ` +
				`jwt:<claim>, path, method or host; names match [A-Za-z0-9_-]+)`,
		},
		{
			name:        "duplicate rule name",
			config:      `{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":1}},{"name":"a","algorithm_config":{"rps":1,"burst":1}}]}`,
			expectedErr: `rules[1].name: duplicate rule name "a" (first used at rules[0].name)`,
		},
		{
			name:        "negative max_keys",
			config:      `{"rules":[{"name":"a","limit_keys":["ip:address"],"max_keys":-1,"algorithm_config":{"rps":1,"burst":1}}]}`,
			expectedErr: "rules[0].max_keys: must be an integer from 0 (unbounded) to 16777216, got -1",
		},
		{
			name:        "cas_max_attempts zero",
			config:      `{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":1}}],"settings":{"cas_max_attempts":0}}`,
			expectedErr: "settings.cas_max_attempts: must be an integer from 1 to 1000, got 0",
		},
		{
			name:        "bundle version",
			config:      `{"bundle_version":2,"policies":[]}`,
			expectedErr: "bundle_version: must be 1, got 2",
		},
		{
			name:        "empty",
			config:      ``,
			expectedErr: "configuration is empty",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var lines []string
			h, err := wasmhost.New(context.Background(), wasmhost.Options{
				Wasm:         loadModule(t),
				PluginConfig: []byte(tc.config),
				Workers:      2,
				LogSink: func(l wasmhost.LogLevel, msg string) {
					mu.Lock()
					defer mu.Unlock()
					lines = append(lines, "["+l.String()+"] "+msg)
				},
			})
			if err == nil {
				closeHost(t, h)
				t.Fatalf("wasmhost.New accepted %s", tc.config)
			}
			if h != nil {
				t.Errorf("wasmhost.New returned a host with its error")
			}
			want := "tokengate: invalid configuration: " + tc.expectedErr
			if !strings.Contains(err.Error(), want) {
				t.Errorf("got error %q\nwant it to contain %q", err, want)
			}
			mu.Lock()
			defer mu.Unlock()
			found := false
			for _, l := range lines {
				found = found || l == "[error] "+want
			}
			if !found {
				t.Errorf("the log has no line %q: %q", "[error] "+want, lines)
			}
		})
	}
}
