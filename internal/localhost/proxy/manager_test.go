package proxy

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

func TestNormalizePath(t *testing.T) {
	for in, want := range map[string]string{
		"/":            "/",
		"/a/./b":       "/a/b",
		"/a/../b":      "/b",
		"/../../a":     "/a",
		"/a/b/..":      "/a/",
		"/a/.":         "/a/",
		"/%61pi/x":     "/api/x",
		"/a%2fb":       "/a%2Fb",
		"/a%7e%41":     "/a~A",
		"/a%zz":        "/a%zz",
		"/%2e%2e/etc":  "/etc",
		"/a//b":        "/a//b",
		"/a/%2E/b/%2e": "/a/b/",
	} {
		got, ok := normalizePath(in)
		if !ok || got != want {
			t.Errorf("normalizePath(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
	if _, ok := normalizePath("a/b"); ok {
		t.Error("a relative path was accepted")
	}
	if got := mergeSlashes("//a///b/"); got != "/a/b/" {
		t.Errorf("mergeSlashes = %q", got)
	}
	if got, found := unescapeSlashes("/a%2fb%5Cc%2"); !found || got != `/a/b\c%2` {
		t.Errorf("unescapeSlashes = %q %v", got, found)
	}
}

// TestManager drives requests through a Manager to the guest and the echo
// upstream: what the filter sees (the path, source.address) and what the
// upstream gets (x-forwarded-for), and the answers Envoy gives itself.
func TestManager(t *testing.T) {
	type want struct {
		status   int
		location string
		source   string   // source.address the guest saw, "" to skip
		path     string   // path the upstream got, "" to skip
		xff      []string // x-forwarded-for lines the upstream got, nil to skip
	}
	tests := []struct {
		name   string
		m      *Manager
		kong   bool
		path   string
		header http.Header
		want   want
	}{
		{"no manager: the path as sent", nil, false, "/x//a/./b", nil, want{status: 200, path: "/x//a/./b"}},
		{"normalize and merge", &Manager{NormalizePath: true, MergeSlashes: true}, false, "/x//a/./b/%62/../c?x=%2e", nil,
			want{status: 200, path: "/x/a/b/c?x=%2e"}},
		{"escaped slash rejected", &Manager{EscapedSlashes: "REJECT_REQUEST", NormalizePath: true}, false, "/a%2Fb", nil, want{status: 400}},
		{"escaped slash redirected", &Manager{EscapedSlashes: "UNESCAPE_AND_REDIRECT"}, false, "/a%2fb?q", nil,
			want{status: 307, location: "/a/b?q"}},
		{"escaped slash forwarded", &Manager{EscapedSlashes: "UNESCAPE_AND_FORWARD", MergeSlashes: true}, false, "/a%2F%2Fb", nil,
			want{status: 200, path: "/a/b"}},
		{"headers too large", &Manager{MaxHeadersKB: 1}, false, "/", http.Header{"X-Big": {strings.Repeat("b", 1100)}}, want{status: 431}},
		{"headers within the bound", &Manager{MaxHeadersKB: 2}, false, "/", http.Header{"X-Big": {strings.Repeat("b", 1100)}}, want{status: 200}},
		{"use_remote_address: the peer, appended", &Manager{UseRemoteAddress: true}, false, "/",
			http.Header{"X-Forwarded-For": {"6.6.6.6"}}, want{status: 200, source: "127.0.0.1:", xff: []string{"6.6.6.6,127.0.0.1"}}},
		{"use_remote_address with a trusted hop", &Manager{UseRemoteAddress: true, XFFNumTrustedHops: 1}, false, "/",
			http.Header{"X-Forwarded-For": {"6.6.6.6, 203.0.113.9"}}, want{status: 200, source: "203.0.113.9:0"}},
		{"no use_remote_address: the right-most entry", &Manager{}, false, "/",
			http.Header{"X-Forwarded-For": {"6.6.6.6, 203.0.113.9"}}, want{status: 200, source: "203.0.113.9:0", xff: []string{"6.6.6.6, 203.0.113.9"}}},
		{"no use_remote_address, no xff: the peer", &Manager{}, false, "/", nil, want{status: 200, source: "127.0.0.1:"}},
		{"skip_xff_append", &Manager{UseRemoteAddress: true, SkipXFFAppend: true}, false, "/",
			http.Header{"X-Forwarded-For": {"6.6.6.6"}}, want{status: 200, xff: []string{"6.6.6.6"}}},
		// Envoy's header map keeps x-forwarded-for as one entry: a second
		// line is appended with ","; Kong keeps the lines.
		{"envoy merges inline headers", nil, false, "/", http.Header{"X-Forwarded-For": {"1.1.1.1", "2.2.2.2"}},
			want{status: 200, xff: []string{"1.1.1.1,2.2.2.2"}}},
		{"kong keeps the lines", nil, true, "/", http.Header{"X-Forwarded-For": {"1.1.1.1", "2.2.2.2"}},
			want{status: 200, xff: []string{"1.1.1.1", "2.2.2.2"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, srv := newGuestHost(t, wasmhost.Options{Workers: 1, Kong: tc.kong}, Options{Manager: tc.m})
			req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.URL.Opaque = tc.path // sent as written, not cleaned
			req.Header = tc.header.Clone()
			if req.Header == nil {
				req.Header = http.Header{}
			}
			req.Header.Set("x-test", "props")
			client := *srv.Client()
			client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.want.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want.status)
			}
			if tc.want.location != "" && resp.Header.Get("Location") != tc.want.location {
				t.Errorf("location %q, want %q", resp.Header.Get("Location"), tc.want.location)
			}
			if tc.want.status != 200 {
				return
			}
			if tc.want.source != "" && !strings.Contains(resp.Header.Get("X-Result"), "source.address="+tc.want.source) {
				t.Errorf("x-result %q lacks source.address=%s", resp.Header.Get("X-Result"), tc.want.source)
			}
			var echo Echo
			if err := json.NewDecoder(resp.Body).Decode(&echo); err != nil {
				t.Fatal(err)
			}
			if tc.want.path != "" && echo.Path != tc.want.path {
				t.Errorf("upstream path %q, want %q", echo.Path, tc.want.path)
			}
			if tc.want.xff != nil && strings.Join(echo.Headers["x-forwarded-for"], "|") != strings.Join(tc.want.xff, "|") {
				t.Errorf("upstream x-forwarded-for %q, want %q", echo.Headers["x-forwarded-for"], tc.want.xff)
			}
		})
	}
}
