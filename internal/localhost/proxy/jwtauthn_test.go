package proxy

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestJWTAuthn checks the host's jwt_authn model: signatures (RS256 and
// ES256, kid), issuer, audiences, exp and nbf, requirements with and
// without allow_missing, the token removed unless forward, and the
// verified payload in the metadata as Envoy's property lookup answers it.
func TestJWTAuthn(t *testing.T) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b := base64.RawURLEncoding.EncodeToString
	pad := func(x []byte) []byte { out := make([]byte, 32); copy(out[32-len(x):], x); return out }
	jwks := fmt.Sprintf(`{"keys":[{"kty":"RSA","kid":"r1","n":"%s","e":"%s"},{"kty":"EC","crv":"P-256","kid":"e1","x":"%s","y":"%s"}]}`,
		b(rk.N.Bytes()), b([]byte{1, 0, 1}), b(pad(ek.X.Bytes())), b(pad(ek.Y.Bytes())))
	keys, err := ParseJWKS([]byte(jwks))
	if err != nil {
		t.Fatal(err)
	}
	sign := func(alg, kid, payload string) string {
		in := b([]byte(`{"alg":"`+alg+`","kid":"`+kid+`"}`)) + "." + b([]byte(payload))
		d := sha256.Sum256([]byte(in))
		var sig []byte
		if alg == "RS256" {
			sig, _ = rsa.SignPKCS1v15(rand.Reader, rk, crypto.SHA256, d[:])
		} else {
			r, s, _ := ecdsa.Sign(rand.Reader, ek, d[:])
			sig = append(pad(r.Bytes()), pad(s.Bytes())...)
		}
		return in + "." + b(sig)
	}
	now := time.Unix(1_700_000_000, 0)
	good := `{"iss":"i","aud":["x","a"],"sub":"s","n":42,"ok":true,"exp":1700000100}`
	j := &JWTAuthn{
		Providers: map[string]*JWTProvider{"p": {Issuer: "i", Audiences: []string{"a"}, Keys: keys, PayloadInMetadata: "pl"}},
		Rules:     []JWTRule{{Prefix: "/open", Providers: []string{"p"}, AllowMissing: true}, {Prefix: "/", Providers: []string{"p"}}},
	}
	tests := []struct {
		name, path, token string
		status            int
	}{
		{"RS256", "/", sign("RS256", "r1", good), 0},
		{"ES256", "/", sign("ES256", "e1", good), 0},
		{"ES256 without kid", "/", sign("ES256", "", good), 0},
		{"kid of another key", "/", sign("ES256", "r1", good), 401},
		{"wrong issuer", "/", sign("ES256", "e1", `{"iss":"j","aud":"a"}`), 401},
		{"wrong audience", "/", sign("ES256", "e1", `{"iss":"i","aud":"b"}`), 401},
		{"expired", "/", sign("ES256", "e1", `{"iss":"i","aud":"a","exp":1700000000}`), 401},
		{"not yet valid", "/", sign("ES256", "e1", `{"iss":"i","aud":"a","nbf":1700000001}`), 401},
		{"alg none", "/", b([]byte(`{"alg":"none"}`)) + "." + b([]byte(good)) + ".", 401},
		{"missing, required", "/", "", 401},
		{"missing, allowed", "/open", "", 0},
		{"bad, allowed missing", "/open", "a.b.c", 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &request{}
			s.req.Add(":path", tc.path)
			if tc.token != "" {
				s.req.Add("authorization", "Bearer "+tc.token)
			}
			status, _ := j.authenticate(s, now)
			if status != tc.status {
				t.Fatalf("status %d, want %d", status, tc.status)
			}
			if tc.status != 0 || tc.token == "" {
				return
			}
			if _, ok := s.req.Get("authorization"); ok {
				t.Error("the token was forwarded without forward: true")
			}
			if v, ok := wasmhost.MetadataProperty(s.metadata, []string{"filter_metadata", "envoy.filters.http.jwt_authn", "pl", "sub"}); !ok || string(v) != "s" {
				t.Errorf("sub = %q %v", v, ok)
			}
			if v, ok := wasmhost.MetadataProperty(s.metadata, []string{"filter_metadata", "envoy.filters.http.jwt_authn", "pl", "n"}); !ok ||
				math.Float64frombits(binary.LittleEndian.Uint64(v)) != 42 {
				t.Errorf("n = %x %v, want the double 42", v, ok)
			}
			if v, ok := wasmhost.MetadataProperty(s.metadata, []string{"filter_metadata", "envoy.filters.http.jwt_authn", "pl", "ok"}); !ok || len(v) != 1 || v[0] != 1 {
				t.Errorf("ok = %x %v", v, ok)
			}
			if _, ok := wasmhost.MetadataProperty(s.metadata, []string{"filter_metadata", "envoy.filters.http.jwt_authn", "pl", "aud"}); ok {
				t.Error("a list was answered")
			}
		})
	}
	var bad json.RawMessage = []byte(`{"keys":[{"kty":"oct","k":"x"}]}`)
	if _, err := ParseJWKS(bad); err == nil {
		t.Error("an oct key was accepted")
	}
}
