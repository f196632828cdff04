package config

import (
	"slices"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// Parse parses and validates a plugin configuration in any of its three
// shapes: one rule, {"rules": [...]}, or a policy bundle
// {"bundle_version": 1, "policies": [...]}. It is strict: unknown fields,
// wrong types and out-of-range values are errors (*ConfigError) naming the
// field's path. The Config it returns is never changed afterwards.
func Parse(data []byte) (*Config, error) {
	if len(strings.Trim(string(data), " \t\r\n")) == 0 {
		return nil, errAt("", "configuration is empty")
	}
	if strings.HasPrefix(string(data), "\xef\xbb\xbf") {
		return nil, errAt("", "configuration starts with a UTF-8 byte order mark (bytes EF BB BF), which JSON does not allow: save the file without it")
	}
	if !ljson.Valid(data) {
		return nil, errAt("", "configuration is not valid JSON: "+ljson.SyntaxError(data))
	}
	root := ljson.ParseBytes(data)
	if !root.IsObject() {
		return nil, errAt("", "configuration must be a JSON object, got "+typeName(root))
	}
	p := parser{names: map[string]string{}, metricNames: map[string]claimed{}}
	cfg := &Config{Settings: Settings{MaxAttempts: defaultMaxAttempts, MaxKeysPerRule: DefaultMaxKeys, IPv6Prefix: DefaultIPv6Prefix, ResponseSettings: defaultResponseSettings()}}
	var err error
	single := false
	switch {
	case root.Get("policies").Exists() || root.Get("bundle_version").Exists():
		err = p.bundle(cfg, root)
	case root.Get("rules").Exists():
		err = p.rulesShape(cfg, root)
	case root.Get("rls_descriptors").Exists():
		// Only the rate-limit service's descriptors: no rule for the filter.
		if err = onlyFields("", root, "rls_descriptors", "settings"); err == nil {
			err = p.settings(cfg, root.Get("settings"))
		}
	default:
		var r *Rule
		single = true
		r, err = p.rule("", root, false)
		if err == nil {
			cfg.Policies = []*Policy{{ID: "default", Rules: []*Rule{r}}}
		}
	}
	if err == nil {
		err = p.rlsDescriptors(cfg, root.Get("rls_descriptors"))
	}
	if err != nil {
		return nil, err
	}
	p.collectRules(cfg)
	if len(cfg.rules) == 0 && len(cfg.RLSDescriptors) == 0 {
		return nil, errAt("", "configuration has no rules")
	}
	if err := checkClusterRules(cfg, single); err != nil {
		return nil, err
	}
	if len(cfg.rules) > MaxRules {
		return nil, errAt("", "has "+strconv.Itoa(len(cfg.rules))+" rules (fallback limits included); at most "+
			strconv.Itoa(MaxRules)+" are allowed, since every applying rule costs each request a shared-data update")
	}
	return cfg, nil
}

// collectRules lists every rule of the policies in cfg.rules, each with its
// policy's mode and its key bound.
func (p *parser) collectRules(cfg *Config) {
	for _, pol := range cfg.Policies {
		for _, r := range pol.Rules {
			r.Shadow = pol.Shadow
			cfg.rules = append(cfg.rules, r)
		}
		if pol.Fallback != nil {
			pol.Fallback.Shadow = pol.Shadow
			cfg.rules = append(cfg.rules, pol.Fallback)
		}
	}
	for _, r := range cfg.rules {
		if !slices.Contains(p.maxKeysSet, r) {
			r.MaxKeys = cfg.Settings.MaxKeysPerRule
		}
		if len(r.Keys) == 0 {
			r.MaxKeys = 0
		}
	}
}

// parser is the state of one Parse.
type parser struct {
	names       map[string]string  // rule name → path where it was defined
	metricNames map[string]claimed // rule name with '-' as '_' → its rule
	// maxKeysSet are the rules with a max_keys of their own (a slice: a
	// map type costs the wasm module tens of kilobytes).
	maxKeysSet []*Rule
}

func (p *parser) rulesShape(cfg *Config, root ljson.Result) error {
	if err := onlyFields("", root, "rules", "settings", "rls_descriptors"); err != nil {
		return err
	}
	rules, err := p.ruleList("rules", root.Get("rules"))
	if err != nil {
		return err
	}
	cfg.Policies = []*Policy{{ID: "default", Rules: rules}}
	return p.settings(cfg, root.Get("settings"))
}

func (p *parser) bundle(cfg *Config, root ljson.Result) error {
	if err := onlyFields("", root, "bundle_version", "policies", "settings", "rls_descriptors"); err != nil {
		return err
	}
	v := root.Get("bundle_version")
	if !v.Exists() {
		return errAt("bundle_version", "is required in a policy bundle")
	}
	if v.Type != ljson.Number || v.Raw != "1" {
		return errAt("bundle_version", "must be 1, got "+short(v.Raw))
	}
	pols := root.Get("policies")
	if !pols.IsArray() {
		return errAt("policies", "must be an array, got "+typeName(pols))
	}
	ids := map[string]bool{}
	var err error
	pols.ForEach(func(k, pv ljson.Result) bool {
		path := "policies[" + k.String() + "]"
		var pol *Policy
		pol, err = p.policy(path, pv)
		if err != nil {
			return false
		}
		if ids[pol.ID] {
			err = errAt(path+".id", "duplicate policy id "+strconv.Quote(pol.ID))
			return false
		}
		ids[pol.ID] = true
		cfg.Policies = append(cfg.Policies, pol)
		return true
	})
	if err != nil {
		return err
	}
	if len(cfg.Policies) == 0 {
		return errAt("policies", "must not be empty")
	}
	return p.settings(cfg, root.Get("settings"))
}

func (p *parser) policy(path string, v ljson.Result) (*Policy, error) {
	if err := fields(path, v, "id", "spec"); err != nil {
		return nil, err
	}
	id, err := requiredName(path+".id", v.Get("id"))
	if err != nil {
		return nil, err
	}
	pol := &Policy{ID: id}
	spath := path + ".spec"
	spec := v.Get("spec")
	if !spec.IsObject() {
		return nil, errAt(spath, "must be an object, got "+typeName(spec))
	}
	if err := onlyFields(spath, spec, "selector", "mode", "rules", "fallback_limit"); err != nil {
		return nil, err
	}
	if pol.Selector, err = selector(spath+".selector", spec.Get("selector")); err != nil {
		return nil, err
	}
	switch mode := spec.Get("mode"); {
	case !mode.Exists():
	case mode.Type != ljson.String:
		return nil, errAt(spath+".mode", "must be a string, got "+typeName(mode))
	case mode.Str == "enforce":
	case mode.Str == "shadow":
		pol.Shadow = true
	default:
		return nil, errAt(spath+".mode", `must be "enforce" or "shadow", got `+strconv.Quote(mode.Str))
	}
	if rules := spec.Get("rules"); rules.Exists() {
		if pol.Rules, err = p.ruleList(spath+".rules", rules); err != nil {
			return nil, err
		}
	}
	if fb := spec.Get("fallback_limit"); fb.Exists() {
		if pol.Fallback, err = p.rule(spath+".fallback_limit", fb, true); err != nil {
			return nil, err
		}
		if pol.Fallback.Name == "" {
			pol.Fallback.Name = id + "-fallback"
			if err := p.claim(spath+".fallback_limit", pol.Fallback.Name); err != nil {
				return nil, err
			}
		}
	}
	if len(pol.Rules) == 0 && pol.Fallback == nil {
		return nil, errAt(spath, "needs rules or a fallback_limit")
	}
	return pol, nil
}

func selector(path string, v ljson.Result) (Selector, error) {
	var s Selector
	if !v.Exists() {
		return s, nil
	}
	if err := fields(path, v, "pathPrefix", "methods", "hosts"); err != nil {
		return s, err
	}
	if pp := v.Get("pathPrefix"); pp.Exists() {
		if pp.Type != ljson.String || !strings.HasPrefix(pp.Str, "/") {
			return s, errAt(path+".pathPrefix", `must be a string starting with "/", got `+short(pp.Raw))
		}
		s.PathPrefix = pp.Str
	}
	var err error
	if s.Methods, err = stringList(path+".methods", v.Get("methods"), func(m string) (string, bool) {
		return lite.ToUpperASCII(m), isToken(m)
	}); err != nil {
		return s, err
	}
	s.Hosts, err = stringList(path+".hosts", v.Get("hosts"), func(h string) (string, bool) {
		// A wildcard is only a whole leading label: "*.example.com".
		wild := strings.IndexByte(h, '*')
		ok := h != "" && !strings.ContainsAny(h, " /:\t") &&
			(wild < 0 || wild == 0 && strings.HasPrefix(h, "*.") && len(h) > 2 && strings.Count(h, "*") == 1)
		return lite.ToLowerASCII(h), ok
	})
	return s, err
}

func stringList(path string, v ljson.Result, norm func(string) (string, bool)) ([]string, error) {
	if !v.Exists() {
		return nil, nil
	}
	if !v.IsArray() {
		return nil, errAt(path, "must be an array of strings, got "+typeName(v))
	}
	var out []string
	var err error
	v.ForEach(func(k, e ljson.Result) bool {
		n, ok := norm(e.Str)
		if e.Type != ljson.String || !ok {
			err = errAt(path+"["+k.String()+"]", "invalid value "+short(e.Raw))
			return false
		}
		out = append(out, n)
		return true
	})
	return out, err
}

func (p *parser) ruleList(path string, v ljson.Result) ([]*Rule, error) {
	if !v.IsArray() {
		return nil, errAt(path, "must be an array, got "+typeName(v))
	}
	var out []*Rule
	var err error
	v.ForEach(func(k, rv ljson.Result) bool {
		var r *Rule
		r, err = p.rule(path+"["+k.String()+"]", rv, false)
		out = append(out, r)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errAt(path, "must not be empty")
	}
	return out, nil
}

// rule parses one rule. A fallback limit may omit its name and has no match.
func (p *parser) rule(path string, v ljson.Result, fallback bool) (*Rule, error) {
	names := []string{"name", "limit_keys", "algorithm", "algorithm_config", "on_store_error", "on_missing_key", "max_keys", "scope", "mode", "lease_max", "lease_ttl_ms"}
	if !fallback {
		names = append(names, "match")
	}
	if err := fields(path, v, names...); err != nil {
		return nil, err
	}
	r := &Rule{}
	if n := v.Get("name"); n.Exists() || !fallback {
		name, err := requiredName(join(path, "name"), n)
		if err != nil {
			return nil, err
		}
		if err := p.claim(join(path, "name"), name); err != nil {
			return nil, err
		}
		r.Name = name
	}
	config, err := algorithm(path, v.Get("algorithm"))
	if err != nil {
		return nil, err
	}
	if err := limitKeys(path, v.Get("limit_keys"), r); err != nil {
		return nil, err
	}
	if err := config(join(path, "algorithm_config"), v.Get("algorithm_config"), r); err != nil {
		return nil, err
	}
	if err := matchConds(join(path, "match"), v.Get("match"), r); err != nil {
		return nil, err
	}
	if err := p.ruleOptions(path, v, r); err != nil {
		return nil, err
	}
	return r, nil
}

// algorithm reads a rule's "algorithm" (a, when it exists) and returns the
// reader of its algorithm_config.
func algorithm(path string, a ljson.Result) (func(string, ljson.Result, *Rule) error, error) {
	switch {
	case !a.Exists(), a.Type == ljson.String && a.Str == "token_bucket":
		return algorithmConfig, nil
	case a.Type == ljson.String && a.Str == "fixed_window":
		return windowConfig, nil
	case a.Type == ljson.String && a.Str == "concurrency":
		return concurrencyConfig, nil
	case a.Type == ljson.String && a.Str == "quota":
		return quotaConfig, nil
	}
	return nil, errAt(join(path, "algorithm"), `unknown algorithm `+short(a.Raw)+`, want "token_bucket", "fixed_window", "concurrency" or "quota"`)
}

// limitKeys reads a rule's "limit_keys" (v, when it exists) into r.Keys.
func limitKeys(path string, v ljson.Result, r *Rule) error {
	if !v.Exists() {
		return nil
	}
	kpath := join(path, "limit_keys")
	if !v.IsArray() {
		return errAt(kpath, "must be an array of descriptors, got "+typeName(v))
	}
	var err error
	v.ForEach(func(k, e ljson.Result) bool {
		epath := kpath + "[" + k.String() + "]"
		if e.Type != ljson.String {
			err = errAt(epath, "must be a string, got "+typeName(e))
			return false
		}
		var d Descriptor
		if d, err = ParseDescriptor(e.Str); err != nil {
			err = errAt(epath, err.Error())
			return false
		}
		for j, prev := range r.Keys {
			if prev == d {
				err = errAt(epath, strconv.Quote(e.Str)+" repeats limit_keys["+strconv.Itoa(j)+"]; a descriptor names a bucket once")
				return false
			}
		}
		r.Keys = append(r.Keys, d)
		return true
	})
	if err != nil {
		return err
	}
	if len(r.Keys) > maxLimitKeys {
		return errAt(kpath, "at most "+strconv.Itoa(maxLimitKeys)+" descriptors")
	}
	return nil
}

// matchConds reads a rule's "match" object (m, when it exists) into
// r.Match.
func matchConds(mpath string, m ljson.Result, r *Rule) error {
	if !m.Exists() {
		return nil
	}
	if !m.IsObject() {
		return errAt(mpath, "must be an object of descriptor → value, got "+typeName(m))
	}
	var err error
	m.ForEach(func(k, e ljson.Result) bool {
		epath := mpath + "." + k.Str
		var d Descriptor
		if d, err = ParseDescriptor(k.Str); err != nil {
			err = errAt(epath, err.Error())
			return false
		}
		if e.Type != ljson.String {
			err = errAt(epath, "expected value must be a string, got "+typeName(e))
			return false
		}
		r.Match = append(r.Match, MatchCond{Descriptor: d, Value: e.Str})
		return true
	})
	return err
}

// ruleOptions reads "max_keys", "scope", the lease fields,
// "on_store_error" and "on_missing_key".
func (p *parser) ruleOptions(path string, v ljson.Result, r *Rule) error {
	if mk := v.Get("max_keys"); mk.Exists() {
		n, err := maxKeys(join(path, "max_keys"), mk)
		if err != nil {
			return err
		}
		r.MaxKeys, p.maxKeysSet = n, append(p.maxKeysSet, r)
	}
	scope, err := choice(join(path, "scope"), v.Get("scope"), "local", "cluster")
	if err != nil {
		return err
	}
	r.Cluster = scope == 1
	if err := leaseFields(path, v, r); err != nil {
		return err
	}
	if err := quotaScope(path, r); err != nil {
		return err
	}
	deny, err := choice(join(path, "on_store_error"), v.Get("on_store_error"), "allow", "deny")
	if err != nil {
		return err
	}
	r.DenyOnStoreError = deny == 1
	// MissingKeySkip, MissingKeyShared, MissingKeyDeny in order.
	r.OnMissingKey, err = choice(join(path, "on_missing_key"), v.Get("on_missing_key"), "skip", "shared", "deny")
	return err
}
