package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestShippedExamplesHoldWithoutKeys (issue 22, item 5), through the built
// module with the shipped files: a request that lacks what a rule is keyed
// on is still limited. examples/tiered.json let a request without a JWT
// pass 25 of 25; examples/bundle.json trusted one x-forwarded-for hop, so
// under make run (no proxy in front) a rotating x-forwarded-for passed 6
// of 6 against a burst of 2, and its upload fallback skipped requests
// without x-api-key.
func TestShippedExamplesHoldWithoutKeys(t *testing.T) {
	type step struct {
		path, xff string
		header    [2]string
	}
	for _, tc := range []struct {
		file  string
		n     int
		req   func(i int) step
		limit int
	}{
		{"tiered.json", 25, func(int) step { return step{path: "/"} }, 5},
		{"bundle.json", 6, func(i int) step { return step{path: "/reports/q3", xff: "203.0.113." + strconv.Itoa(i+1)} }, 2},
		{"bundle.json", 10, func(int) step { return step{path: "/upload"} }, 4},
		{"bundle.json", 10, func(i int) step {
			return step{path: "/upload", header: [2]string{"x-api-key", "k" + strconv.Itoa(i%2)}}
		}, 8},
	} {
		t.Run(tc.file+" "+tc.req(0).path, func(t *testing.T) {
			cfg, err := os.ReadFile("../examples/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			h, _ := startHost(t, hostOpts(string(cfg), false, 1, wasmhost.NewFakeClock(t0), nil))
			admitted := 0
			for i := range tc.n {
				s := tc.req(i)
				req := httptest.NewRequest(http.MethodGet, s.path, nil)
				req.Host = "example.com"
				req.RemoteAddr = "127.0.0.1:4242"
				if s.xff != "" {
					req.Header.Set("X-Forwarded-For", s.xff)
				}
				if s.header[0] != "" {
					req.Header.Set(s.header[0], s.header[1])
				}
				rec := httptest.NewRecorder()
				proxy.New(h, proxy.Options{}).ServeHTTP(rec, req)
				if rec.Code == http.StatusOK {
					admitted++
				}
			}
			if admitted != tc.limit {
				t.Errorf("%d of %d admitted, want %d", admitted, tc.n, tc.limit)
			}
		})
	}
}

// TestLoginResetKeyedByUser (issue 22, item 6), through the built module
// with the login rule of examples/llm-usage.json (5 failed logins, refilled
// by a success): an attacker guesses at alice's password and logs into its
// own account (mallory) every fourth request. Keyed by address alone, each
// of mallory's successes refilled the budget: 38 of 38 guesses reached the
// upstream. Keyed by address and user, alice's guesses are held to 5.
func TestLoginResetKeyedByUser(t *testing.T) {
	file, err := os.ReadFile("../examples/llm-usage.json")
	if err != nil {
		t.Fatal(err)
	}
	var example struct {
		Rules []json.RawMessage `json:"rules"`
	}
	if err := json.Unmarshal(file, &example); err != nil {
		t.Fatal(err)
	}
	cfg := ""
	for _, r := range example.Rules {
		if bytes.Contains(r, []byte(`"name": "login-failures"`)) {
			cfg = `{"rules":[` + string(r) + `]}`
		}
	}
	if cfg == "" {
		t.Fatal("examples/llm-usage.json has no rule login-failures")
	}
	guesses := 0
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-username") == "mallory" {
			return // 200: the attacker's own password is right
		}
		guesses++
		w.WriteHeader(http.StatusUnauthorized)
	})
	opts := hostOpts(cfg, false, 1, wasmhost.NewFakeClock(t0), nil)
	_, srv := startHost(t, opts, proxy.Options{Upstream: up})
	for i := range 50 {
		user := "alice"
		if i%4 == 3 {
			user = "mallory"
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/login", nil)
		req.Header.Set("x-username", user)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if guesses != 5 {
		t.Errorf("%d of alice's guesses reached the upstream, want the budget of 5", guesses)
	}
}

// TestOnMissingKeyDenyReply: "on_missing_key": "deny" answers a request
// without the key through the module's one reply builder: the rejection
// status, reason missing_key, no Retry-After.
func TestOnMissingKeyDenyReply(t *testing.T) {
	cfg := `{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"on_missing_key":"deny","algorithm_config":{"rps":1,"burst":2}}],` +
		`"settings":{"rule_headers":true}}`
	_, srv := startHost(t, hostOpts(cfg, false, 1, wasmhost.NewFakeClock(t0), nil))
	resp, body := get(t, srv, "/", nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Tokengate-Reason") != "missing_key" ||
		resp.Header.Get("Retry-After") != "" || body != `{"error":"rate_limited","reason":"missing_key","rule":"per-key"}`+"\n" {
		t.Errorf("got %d %v %q, want 429, reason missing_key, no Retry-After", resp.StatusCode, resp.Header, body)
	}
	if resp, _ := get(t, srv, "/", map[string]string{"x-api-key": "k"}); resp.StatusCode != http.StatusOK {
		t.Errorf("with the key: got %d, want 200", resp.StatusCode)
	}
}
