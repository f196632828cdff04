package envoyconf

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

// JWTAuthnType is the typed_config @type of Envoy's jwt_authn filter.
const JWTAuthnType = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"

// JWTAuthn is the part of a jwt_authn filter the local host reproduces.
type JWTAuthn struct {
	Providers map[string]JWTProvider
	Rules     []JWTRule
}

// JWTProvider is one provider: its JWKS (local_jwks, inline or from a
// file) and what to check and keep.
type JWTProvider struct {
	Issuer            string
	Audiences         []string
	JWKS              []byte
	PayloadInMetadata string
	Forward           bool
}

// JWTRule is match.prefix with a requirement: any of Providers, and
// AllowMissing when requires_any lists allow_missing.
type JWTRule struct {
	Prefix       string
	Providers    []string
	AllowMissing bool
}

// JWTAuthnBefore returns the jwt_authn filter that runs before the plugin
// in its connection manager's http_filters, or nil if there is none.
func JWTAuthnBefore(p Plugin) (*JWTAuthn, error) {
	filters, _ := p.Manager["http_filters"].([]any)
	for i, f := range filters {
		fo, _ := f.(map[string]any)
		tc, _ := fo["typed_config"].(map[string]any)
		path := fmt.Sprintf("%s.http_filters[%d].typed_config", p.ManagerPath, i)
		if path == p.Path {
			return nil, nil // the plugin comes first
		}
		if tc["@type"] == JWTAuthnType {
			return jwtAuthn(path, tc)
		}
	}
	return nil, nil
}

func jwtAuthn(path string, tc map[string]any) (*JWTAuthn, error) {
	if err := only(path, tc, "@type", "providers", "rules"); err != nil {
		return nil, err
	}
	j := &JWTAuthn{Providers: map[string]JWTProvider{}}
	providers, _ := tc["providers"].(map[string]any)
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		pp := path + ".providers." + name
		po, ok := providers[name].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("envoyconf: %s: want an object", pp)
		}
		if err := only(pp, po, "issuer", "audiences", "local_jwks", "payload_in_metadata", "forward"); err != nil {
			return nil, err
		}
		var p JWTProvider
		p.Issuer, _ = po["issuer"].(string)
		p.PayloadInMetadata, _ = po["payload_in_metadata"].(string)
		p.Forward, _ = po["forward"].(bool)
		if auds, ok := po["audiences"].([]any); ok {
			for _, a := range auds {
				s, _ := a.(string)
				p.Audiences = append(p.Audiences, s)
			}
		}
		lj, _ := po["local_jwks"].(map[string]any)
		switch {
		case lj["inline_string"] != nil:
			s, _ := lj["inline_string"].(string)
			p.JWKS = []byte(s)
		case lj["filename"] != nil:
			f, _ := lj["filename"].(string)
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("envoyconf: %s.local_jwks.filename: %w", pp, err)
			}
			p.JWKS = b
		default:
			return nil, fmt.Errorf("envoyconf: %s: needs local_jwks with inline_string or filename (the local host fetches no remote_jwks)", pp)
		}
		j.Providers[name] = p
	}
	rules, _ := tc["rules"].([]any)
	for i, r := range rules {
		rp := fmt.Sprintf("%s.rules[%d]", path, i)
		ro, _ := r.(map[string]any)
		if err := only(rp, ro, "match", "requires"); err != nil {
			return nil, err
		}
		m, _ := ro["match"].(map[string]any)
		if err := only(rp+".match", m, "prefix"); err != nil {
			return nil, err
		}
		var rule JWTRule
		rule.Prefix, _ = m["prefix"].(string)
		req, _ := ro["requires"].(map[string]any)
		if err := requirement(rp+".requires", req, &rule, true); err != nil {
			return nil, err
		}
		j.Rules = append(j.Rules, rule)
	}
	return j, nil
}

func requirement(path string, req map[string]any, rule *JWTRule, top bool) error {
	switch {
	case req == nil:
		return nil // no requirement: anything passes
	case req["provider_name"] != nil:
		s, _ := req["provider_name"].(string)
		rule.Providers = append(rule.Providers, s)
	case req["allow_missing"] != nil && !top:
		rule.AllowMissing = true
	case req["requires_any"] != nil && top:
		ra, _ := req["requires_any"].(map[string]any)
		list, _ := ra["requirements"].([]any)
		for i, e := range list {
			eo, _ := e.(map[string]any)
			if err := requirement(fmt.Sprintf("%s.requires_any.requirements[%d]", path, i), eo, rule, false); err != nil {
				return err
			}
		}
	default:
		keys := make([]string, 0, len(req))
		for k := range req {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return fmt.Errorf("envoyconf: %s: the local host reproduces provider_name and requires_any of provider_name and allow_missing, not %s", path, strings.Join(keys, ", "))
	}
	return nil
}

// only fails naming the first key of obj not in allowed.
func only(path string, obj map[string]any, allowed ...string) error {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ok := false
		for _, a := range allowed {
			ok = ok || a == k
		}
		if !ok {
			return fmt.Errorf("envoyconf: the local host does not reproduce %s.%s", path, k)
		}
	}
	return nil
}
