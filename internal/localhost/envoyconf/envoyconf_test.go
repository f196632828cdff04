package envoyconf

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

const bootstrap = `
static_resources:
  listeners:
  - name: main
    address:
      socket_address: { address: 0.0.0.0, port_value: 10000 }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          http_filters:
          - name: envoy.filters.http.wasm
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: tokengate
                root_id: tokengate_root
                failure_policy: FAIL_CLOSED
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: |
                    {"rules": [{"name": "per-ip", "tokens_per_second": 5}]}
                vm_config:
                  vm_id: tokengate_vm
                  runtime: envoy.wasm.runtime.v8
                  configuration:
                    "@type": type.googleapis.com/google.protobuf.BytesValue
                    value: dm0tY29uZmln
                  code:
                    local:
                      filename: build/tokengate.wasm
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`

func TestFind(t *testing.T) {
	second := strings.Replace(bootstrap, "- name: envoy.filters.http.router", `- name: other
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: other
                fail_open: true
          - name: envoy.filters.http.router`, 1)
	tests := []struct {
		name        string
		doc         string
		plugin      string
		expected    Plugin
		expectedErr string
	}{
		{
			name: "the only wasm filter",
			doc:  bootstrap,
			expected: Plugin{
				Path: "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config",
				Name: "tokengate", RootID: "tokengate_root", VMID: "tokengate_vm",
				Configuration:   []byte(`{"rules": [{"name": "per-ip", "tokens_per_second": 5}]}` + "\n"),
				VMConfiguration: []byte("vm-config"),
				WasmFile:        "build/tokengate.wasm",
				FailurePolicy:   "FAIL_CLOSED",
			},
		},
		{
			name:   "by name, deprecated fail_open",
			doc:    second,
			plugin: "other",
			expected: Plugin{
				Path: "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[1].typed_config",
				Name: "other", FailurePolicy: "FAIL_OPEN",
			},
		},
		{name: "two without a name", doc: second, expectedErr: `envoyconf: 2 wasm filters ("tokengate", "other"); choose one by name`},
		{name: "unknown name", doc: bootstrap, plugin: "x", expectedErr: `envoyconf: no wasm filter named "x" (have "tokengate")`},
		{name: "none", doc: "admin: {}\n", expectedErr: "envoyconf: no HTTP filter with typed_config @type " + WasmFilterType},
		{name: "not yaml", doc: "a: [", expectedErr: "envoyconf: parsing YAML:"},
		{
			name:        "struct configuration",
			doc:         strings.Replace(bootstrap, "google.protobuf.StringValue", "google.protobuf.Struct", 1),
			expectedErr: `.config.configuration.@type: "type.googleapis.com/google.protobuf.Struct" is not supported`,
		},
		{
			name:        "wrong type",
			doc:         strings.Replace(bootstrap, "root_id: tokengate_root", "root_id: [1]", 1),
			expectedErr: ".config.root_id: want a string, got a list",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Find([]byte(tc.doc), tc.plugin)
			if tc.expectedErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.expectedErr) {
					t.Fatalf("got error %v, want one containing %q", err, tc.expectedErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.ManagerPath != "static_resources.listeners[0].filter_chains[0].filters[0].typed_config" || got.Manager["stat_prefix"] != "ingress" {
				t.Errorf("enclosing manager %q: %v", got.ManagerPath, got.Manager["stat_prefix"])
			}
			got.Manager, got.ManagerPath = nil, "" // checked above
			if !reflect.DeepEqual(got, tc.expected) {
				t.Errorf("got  %+v\nwant %+v", got, tc.expected)
			}
		})
	}
}

func FuzzPlugins(f *testing.F) {
	f.Add([]byte(bootstrap))
	f.Add([]byte(`{"@type": "` + WasmFilterType + `", "config": {"configuration": 3}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		_, _ = Plugins(doc) // must not panic
	})
}

// TestConnectionManager reads the shipped envoy.yaml's connection manager
// through the plugin that sits in it, and refuses settings the local host
// does not reproduce, by name.
func TestConnectionManager(t *testing.T) {
	doc, err := os.ReadFile("../../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Find(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	if p.Manager == nil || p.ManagerPath != "static_resources.listeners[0].filter_chains[0].filters[0].typed_config" {
		t.Fatalf("manager at %q (%v)", p.ManagerPath, p.Manager != nil)
	}
	m, err := ConnectionManager(p.ManagerPath, p.Manager)
	if err != nil {
		t.Fatal(err)
	}
	want := Manager{NormalizePath: true, MergeSlashes: true, EscapedSlashes: "REJECT_REQUEST", UseRemoteAddress: true, MaxHeadersKB: 60,
		MaxHeadersCount: 100} // Envoy's default, a field added for issue 22 item 11
	if m != want {
		t.Errorf("got %+v, want %+v", m, want)
	}

	for _, tc := range []struct{ yaml, err string }{
		{"strip_any_host_port: true", "does not reproduce static_resources.listeners[0].filter_chains[0].filters[0].typed_config.strip_any_host_port"},
		{"common_http_protocol_options: { headers_with_underscores_action: REJECT_REQUEST }", "common_http_protocol_options.headers_with_underscores_action"},
		{"strip_any_host_port: false", ""},
		{"max_request_headers_kb: 0", "max_request_headers_kb: want an integer from 1 to 8192"},
		{"max_request_headers_kb: 96", ""},
		{"common_http_protocol_options: { max_headers_count: 0 }", "max_headers_count: want an integer from 1 to 1048576"},
		{"common_http_protocol_options: { max_headers_count: 200 }", ""},
		{"path_with_escaped_slashes_action: SOMETIMES", "unknown action SOMETIMES"},
		{"normalize_path: yes please", "normalize_path: want true or false"},
		{"stream_idle_timeout: 300s", ""},
		{"stream_idle_timeout: 0s", ""},
		{"stream_idle_timeout: 5m", `stream_idle_timeout: want a duration such as "300s", got 5m`},
		{"request_timeout: -1s", `request_timeout: want a duration such as "300s"`},
		{"request_timeout: 2.5s", ""},
	} {
		d := strings.Replace(bootstrap, "          stat_prefix: ingress\n", "          stat_prefix: ingress\n          "+tc.yaml+"\n", 1)
		p, err := Find([]byte(d), "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = ConnectionManager(p.ManagerPath, p.Manager)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: got %v, want %q", tc.yaml, err, tc.err)
		}
	}
}

// TestClusters reads the static clusters the local host can call, with
// HTTP/2 from either way of saying it, and the route's cluster.
func TestClusters(t *testing.T) {
	doc, err := os.ReadFile("../../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cs, err := Clusters(doc)
	if err != nil {
		t.Fatal(err)
	}
	if c := cs["upstream"]; c.Address != "127.0.0.1:8080" || c.HTTP2 {
		t.Errorf("upstream: %+v", c)
	}
	p, err := Find(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := RouteCluster(p); !ok || name != "upstream" {
		t.Errorf("route cluster %q %v", name, ok)
	}
	extra := `
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: rls
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 8081 } } } }] }]
  - name: old-h2
    http2_protocol_options: {}
    load_assignment:
      endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: "::1", port_value: 9 } } } }] }]
  - name: dns-only
    type: LOGICAL_DNS
`
	d := strings.Replace(bootstrap, "static_resources:\n", "static_resources:\n  clusters:"+extra, 1)
	cs, err = Clusters([]byte(d))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Cluster{"rls": {Name: "rls", Address: "127.0.0.1:8081", HTTP2: true}, "old-h2": {Name: "old-h2", Address: "[::1]:9", HTTP2: true}}
	if !reflect.DeepEqual(cs, want) {
		t.Errorf("got %+v, want %+v", cs, want)
	}
}

// TestConnectionManagerTimeouts: stream_idle_timeout and request_timeout
// are read (issue 30: the local host bounds idle and slow request bodies
// as Envoy does); stream_idle_timeout left out is Envoy's default (nil),
// "0s" disables it.
func TestConnectionManagerTimeouts(t *testing.T) {
	for _, tc := range []struct {
		yaml    string
		idle    *time.Duration
		request time.Duration
	}{
		{"", nil, 0},
		{"stream_idle_timeout: 30s", ptr(30 * time.Second), 0},
		{"stream_idle_timeout: 0s", ptr(0), 0},
		{"request_timeout: 0.5s", nil, 500 * time.Millisecond},
	} {
		d := strings.Replace(bootstrap, "          stat_prefix: ingress\n", "          stat_prefix: ingress\n          "+tc.yaml+"\n", 1)
		p, err := Find([]byte(d), "")
		if err != nil {
			t.Fatal(err)
		}
		m, err := ConnectionManager(p.ManagerPath, p.Manager)
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if (m.StreamIdleTimeout == nil) != (tc.idle == nil) || m.StreamIdleTimeout != nil && *m.StreamIdleTimeout != *tc.idle || m.RequestTimeout != tc.request {
			t.Errorf("%q: got idle %v request %v, want %v %v", tc.yaml, m.StreamIdleTimeout, m.RequestTimeout, tc.idle, tc.request)
		}
	}
}

func ptr(d time.Duration) *time.Duration { return &d }
