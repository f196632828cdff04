package e2e

import (
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMakeRunVerifiedTiers runs `make run`'s host on the shipped envoy.yaml,
// whose jwt_authn filter verifies tokens before tokengate and whose plugin
// reads claims from the verified payload. The example tokens of
// examples/jwt pick their tier; a forged token claiming "enterprise" (no
// signature, or a valid signature over another payload) is refused by
// jwt_authn with 401 and never reaches a tier; no token gets the fallback.
func TestMakeRunVerifiedTiers(t *testing.T) {
	l := startLocal(t)
	token := func(plan string) string {
		b, err := os.ReadFile("../examples/jwt/" + plan + ".jwt")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	enc := base64.RawURLEncoding.EncodeToString
	forgedPayload := enc([]byte(`{"iss":"https://tokengate.example/demo","aud":"tokengate-demo","sub":"mallory","plan":"enterprise"}`))
	free := strings.Split(token("free"), ".")
	tests := []struct {
		name, auth, key string
		status          int
		rule            string // a RateLimit member this rule must name
	}{
		{"free token", "Bearer " + token("free"), "k-free", 200, `"tier-free"`},
		{"pro token", "Bearer " + token("pro"), "k-pro", 200, `"tier-pro"`},
		{"enterprise token", "Bearer " + token("enterprise"), "k-ent", 200, `"tier-enterprise"`},
		{"no token", "", "k-none", 200, `"api-fallback"`},
		{"unsigned enterprise claim", "Bearer " + enc([]byte(`{"alg":"none"}`)) + "." + forgedPayload + ".", "k-forged", 401, ""},
		{"free signature over an enterprise payload", "Bearer " + free[0] + "." + forgedPayload + "." + free[2], "k-forged2", 401, ""},
	}
	c := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, l.base+"/api/items", nil)
			req.Header.Set("x-api-key", tc.key)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%q), want %d", resp.StatusCode, body, tc.status)
			}
			rl := resp.Header.Get("RateLimit")
			if tc.rule != "" && !strings.Contains(rl, tc.rule) {
				t.Errorf("RateLimit %q does not name %s", rl, tc.rule)
			}
			if tc.status == 401 && (rl != "" || !strings.Contains(string(body), "Jwt verification fails")) {
				t.Errorf("401 with RateLimit %q, body %q: jwt_authn answers before tokengate", rl, body)
			}
			if strings.Contains(rl, "tier-enterprise") && tc.key != "k-ent" {
				t.Errorf("forged claims reached the enterprise tier: %q", rl)
			}
		})
	}
}
