package config

import (
	"strconv"

	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

func (p *parser) settings(cfg *Config, v ljson.Result) error {
	if !v.Exists() {
		return nil
	}
	if !v.IsObject() {
		return errAt("settings", "must be an object, got "+typeName(v))
	}
	if err := onlyFields("settings", v, append([]string{"cas_max_attempts", "xff_trusted_hops", "xff_trusted_cidrs", "jwt_payload_in_metadata", "rls", "max_keys_per_rule", "ipv6_prefix"}, responseSettingFields...)...); err != nil {
		return err
	}
	if err := responseSettings(&cfg.Settings.ResponseSettings, v); err != nil {
		return err
	}
	if mk := v.Get("max_keys_per_rule"); mk.Exists() {
		n, err := maxKeys("settings.max_keys_per_rule", mk)
		if err != nil {
			return err
		}
		cfg.Settings.MaxKeysPerRule = n
	}
	if h := v.Get("xff_trusted_hops"); h.Exists() {
		n, ok := integer(h)
		if !ok || n < 0 || n > MaxXFFHops {
			return errAt("settings.xff_trusted_hops", "must be an integer from 0 to "+strconv.Itoa(MaxXFFHops)+", got "+short(h.Raw))
		}
		cfg.Settings.XFFTrustedHops = int(n)
	}
	if p := v.Get("ipv6_prefix"); p.Exists() {
		n, ok := integer(p)
		if !ok || n < 1 || n > 128 {
			return errAt("settings.ipv6_prefix", "must be an integer from 1 to 128 (bits of an IPv6 client address that key it), got "+short(p.Raw))
		}
		cfg.Settings.IPv6Prefix = int(n)
	}
	if c := v.Get("xff_trusted_cidrs"); c.Exists() {
		if cfg.Settings.XFFTrustedHops > 0 {
			return errAt("settings.xff_trusted_cidrs", "cannot be combined with xff_trusted_hops: choose one way to trust x-forwarded-for")
		}
		var err error
		cfg.Settings.XFFTrustedCIDRs, err = trustedCIDRs("settings.xff_trusted_cidrs", c)
		if err != nil {
			return err
		}
	}
	if j := v.Get("jwt_payload_in_metadata"); j.Exists() {
		if j.Type != ljson.String || !validMetadataKey(j.Str) {
			return errAt("settings.jwt_payload_in_metadata", "must be jwt_authn's payload_in_metadata name (Istio uses the issuer), 1 to 256 printable ASCII characters, got "+short(j.Raw))
		}
		cfg.Settings.JWTPayloadInMetadata = j.Str
	}
	if r := v.Get("rls"); r.Exists() {
		var err error
		if cfg.Settings.RLS, err = rlsSettings("settings.rls", r); err != nil {
			return err
		}
	}
	if a := v.Get("cas_max_attempts"); a.Exists() {
		n, ok := integer(a)
		if !ok || n < 1 || n > maxMaxAttempts {
			return errAt("settings.cas_max_attempts", "must be an integer from 1 to "+strconv.Itoa(maxMaxAttempts)+", got "+short(a.Raw))
		}
		cfg.Settings.MaxAttempts = int(n)
	}
	return nil
}

func maxKeys(path string, v ljson.Result) (int, error) {
	n, ok := integer(v)
	if !ok || n < 0 || n > maxMaxKeys {
		return 0, errAt(path, "must be an integer from 0 (unbounded) to "+strconv.Itoa(maxMaxKeys)+", got "+short(v.Raw))
	}
	return int(n), nil
}

// claim records a rule name, rejecting duplicates: names are part of the
// shared-data keys and metric names, so they must be unique.
// maxTrustedCIDRs bounds settings.xff_trusted_cidrs: each is compared
// with every x-forwarded-for entry walked.
const maxTrustedCIDRs = 64

func trustedCIDRs(path string, v ljson.Result) ([]lite.CIDR, error) {
	if !v.IsArray() {
		return nil, errAt(path, "must be an array of CIDR strings, got "+typeName(v))
	}
	list := v.Array()
	if len(list) == 0 || len(list) > maxTrustedCIDRs {
		return nil, errAt(path, "must hold 1 to "+strconv.Itoa(maxTrustedCIDRs)+" CIDRs, got "+strconv.Itoa(len(list)))
	}
	out := make([]lite.CIDR, 0, len(list))
	for i, e := range list {
		c, ok := lite.ParseCIDR(e.Str)
		if e.Type != ljson.String || !ok {
			return nil, errAt(path+"["+strconv.Itoa(i)+"]", "must be an address prefix such as \"10.0.0.0/8\" or \"2001:db8::/32\", got "+short(e.Raw))
		}
		out = append(out, c)
	}
	return out, nil
}

// validMetadataKey accepts a metadata key that can be one segment of a
// property path: printable ASCII, so never the NUL that separates them.
func validMetadataKey(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
