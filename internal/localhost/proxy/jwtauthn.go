package proxy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"time"
)

// JWTAuthn is what Envoy's jwt_authn filter does in front of the module,
// for the settings the local host reproduces: bearer tokens in
// Authorization, RS256 and ES256 keys from a local JWKS, issuer and
// audiences, exp and nbf, the verified payload in the dynamic metadata
// (payload_in_metadata) and the token removed unless forward. Written from
// Envoy's jwt_authn documentation; the host's own verifier, independent of
// the module.
type JWTAuthn struct {
	Providers map[string]*JWTProvider
	// Rules are tried in order; the first whose Prefix starts the path
	// decides. A path no rule matches needs no token.
	Rules []JWTRule
}

// JWTProvider is one entry of jwt_authn's providers.
type JWTProvider struct {
	Issuer            string
	Audiences         []string
	Keys              []JWK
	PayloadInMetadata string
	Forward           bool
}

// JWTRule is one entry of jwt_authn's rules: match.prefix and a
// requirement. With AllowMissing a request without a token passes, but a
// token that does not verify is still refused (requires_any of a provider
// and allow_missing).
type JWTRule struct {
	Prefix       string
	Providers    []string // any of them
	AllowMissing bool
}

// JWK is a verification key.
type JWK struct {
	Kid string
	Alg string // "RS256" or "ES256"
	Key crypto.PublicKey
}

// ParseJWKS reads a JSON Web Key Set with RSA and EC P-256 keys.
func ParseJWKS(data []byte) ([]JWK, error) {
	var set struct {
		Keys []struct {
			Kty, Kid, Alg, Crv, N, E, X, Y string
		} `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	var out []JWK
	for i, k := range set.Keys {
		b := func(s string) *big.Int {
			d, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
			if err != nil || len(d) == 0 {
				return nil
			}
			return new(big.Int).SetBytes(d)
		}
		switch k.Kty {
		case "RSA":
			n, e := b(k.N), b(k.E)
			if n == nil || e == nil || !e.IsInt64() {
				return nil, fmt.Errorf("jwks: keys[%d]: bad RSA n or e", i)
			}
			out = append(out, JWK{Kid: k.Kid, Alg: "RS256", Key: &rsa.PublicKey{N: n, E: int(e.Int64())}})
		case "EC":
			x, y := b(k.X), b(k.Y)
			if k.Crv != "P-256" || x == nil || y == nil {
				return nil, fmt.Errorf("jwks: keys[%d]: only P-256 EC keys are supported", i)
			}
			out = append(out, JWK{Kid: k.Kid, Alg: "ES256", Key: &ecdsa.PublicKey{Curve: elliptic.P256(), X: x, Y: y}})
		default:
			return nil, fmt.Errorf("jwks: keys[%d]: unsupported kty %q", i, k.Kty)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("jwks: no keys")
	}
	return out, nil
}

// authenticate applies the filter to a stream. It returns 0, or 401 with
// the body Envoy sends, when the request is refused.
func (j *JWTAuthn) authenticate(s *request, now time.Time) (int, string) {
	path, _ := s.req.Get(":path")
	var rule *JWTRule
	for i := range j.Rules {
		if strings.HasPrefix(path, j.Rules[i].Prefix) {
			rule = &j.Rules[i]
			break
		}
	}
	if rule == nil {
		return 0, ""
	}
	auth, ok := s.req.Get("authorization")
	tok, hasBearer := strings.CutPrefix(auth, "Bearer ")
	if !ok || !hasBearer || strings.TrimSpace(tok) == "" {
		if rule.AllowMissing {
			return 0, ""
		}
		return http.StatusUnauthorized, "Jwt is missing"
	}
	tok = strings.TrimSpace(tok)
	for _, name := range rule.Providers {
		p := j.Providers[name]
		if p == nil {
			continue
		}
		payload, err := p.verify(tok, now)
		if err != nil {
			continue
		}
		if p.PayloadInMetadata != "" {
			if s.metadata == nil {
				s.metadata = map[string]map[string]any{}
			}
			ns := s.metadata["envoy.filters.http.jwt_authn"]
			if ns == nil {
				ns = map[string]any{}
				s.metadata["envoy.filters.http.jwt_authn"] = ns
			}
			ns[p.PayloadInMetadata] = payload
		}
		if !p.Forward {
			s.req.Remove("authorization")
		}
		return 0, ""
	}
	return http.StatusUnauthorized, "Jwt verification fails"
}

// verify checks a compact JWS and returns its payload.
func (p *JWTProvider) verify(tok string, now time.Time) (map[string]any, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, errors.New("not a JWS")
	}
	dec := func(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
	hb, err := dec(parts[0])
	if err != nil {
		return nil, err
	}
	var hdr struct{ Alg, Kid string }
	if err := json.Unmarshal(hb, &hdr); err != nil {
		return nil, err
	}
	sig, err := dec(parts[2])
	if err != nil {
		return nil, err
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	verified := false
	for _, k := range p.Keys {
		if k.Alg != hdr.Alg || hdr.Kid != "" && k.Kid != "" && k.Kid != hdr.Kid {
			continue
		}
		switch key := k.Key.(type) {
		case *rsa.PublicKey:
			verified = rsa.VerifyPKCS1v15(key, crypto.SHA256, digest[:], sig) == nil
		case *ecdsa.PublicKey:
			verified = len(sig) == 64 && ecdsa.Verify(key, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:]))
		}
		if verified {
			break
		}
	}
	if !verified {
		return nil, errors.New("signature")
	}
	pb, err := dec(parts[1])
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(pb))
	d.UseNumber()
	var claims map[string]any
	if err := d.Decode(&claims); err != nil {
		return nil, err
	}
	if p.Issuer != "" && claims["iss"] != p.Issuer {
		return nil, errors.New("issuer")
	}
	if len(p.Audiences) > 0 && !audienceOK(claims["aud"], p.Audiences) {
		return nil, errors.New("audience")
	}
	unix := func(k string) (float64, bool) {
		n, ok := claims[k].(json.Number)
		if !ok {
			return 0, false
		}
		f, err := n.Float64()
		return f, err == nil
	}
	t := float64(now.Unix())
	if exp, ok := unix("exp"); ok && t >= exp {
		return nil, errors.New("expired")
	}
	if nbf, ok := unix("nbf"); ok && t < nbf {
		return nil, errors.New("not yet valid")
	}
	return claims, nil
}

func audienceOK(aud any, want []string) bool {
	var have []string
	switch a := aud.(type) {
	case string:
		have = []string{a}
	case []any:
		for _, e := range a {
			if s, ok := e.(string); ok {
				have = append(have, s)
			}
		}
	}
	for _, h := range have {
		for _, w := range want {
			if h == w {
				return true
			}
		}
	}
	return false
}
