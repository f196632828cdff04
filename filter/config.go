package filter

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/lite/ljson"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/lite"
	"github.com/tokengate/tokengate/sharedstate"
)

// Config is a parsed, validated plugin configuration. It is built once per
// proxy_on_configure and then only read, by every stream of the plugin.
type Config struct {
	// Policies in configuration order. Shapes 1 and 2 give one enforce-mode
	// policy with id "default" that matches every request.
	Policies []*Policy
	// Settings are the plugin-wide options.
	Settings Settings
	// RLSDescriptors ("rls_descriptors") map descriptors of Envoy's own
	// ratelimit filter to token buckets for the rate-limit service; the
	// filter validates them and applies none. See RLSDomain.
	RLSDescriptors []*RLSDomain

	rules []*Rule // every rule, fallbacks included, in configuration order
}

// Rules returns every rule of every policy, fallback limits included.
func (c *Config) Rules() []*Rule { return c.rules }

// Settings are plugin-wide options ("settings" in shapes 2 and 3).
type Settings struct {
	// ResponseSettings say what a limited client sees.
	ResponseSettings

	// MaxAttempts bounds the read → decide → compare-and-swap rounds per
	// request ("cas_max_attempts", default 64). Between rounds the worker
	// spins a short random time (sharedstate.SpinBackoff). When they run out
	// the request fails open and fail_open is counted.
	MaxAttempts int
	// XFFTrustedHops is how many proxies in front of this one append the
	// address they saw to x-forwarded-for ("xff_trusted_hops", default 0).
	// With N > 0 the client IP is the N-th address from the right of
	// x-forwarded-for; with 0, or when that entry is missing or not an IP
	// address, it is the connection's source.address and x-forwarded-for is
	// ignored, so a client cannot spoof it.
	XFFTrustedHops int
	// XFFTrustedCIDRs are the addresses of trusted proxies
	// ("xff_trusted_cidrs"), an alternative to XFFTrustedHops as in Envoy's
	// xff original-IP detection: when the connection's peer is in one of
	// them, the client IP is the right-most x-forwarded-for entry that is
	// not (the left-most when all are); otherwise it is the peer.
	XFFTrustedCIDRs []lite.CIDR
	// JWTPayloadInMetadata, when set ("jwt_payload_in_metadata"), makes
	// jwt:<claim> read the payload Envoy's jwt_authn filter verified and
	// stored under this payload_in_metadata name, instead of decoding the
	// unverified bearer token.
	JWTPayloadInMetadata string
	// RLS is the rate-limit service that decides rules with "scope":
	// "cluster" ("rls"); nil when none is configured.
	RLS *RLSSettings
	// MaxKeysPerRule is the default of Rule.MaxKeys ("max_keys_per_rule",
	// default 65536).
	MaxKeysPerRule int
}

// Policy is a group of rules that apply to the requests its selector matches.
type Policy struct {
	ID       string
	Selector Selector
	// Shadow reports whether the policy only observes: its buckets live
	// under the "shadow:" key prefix, it never rejects and adds no headers.
	Shadow bool
	Rules  []*Rule
	// Fallback applies when no rule of the policy applies; nil if none.
	Fallback *Rule
}

// Selector chooses the requests a policy applies to. An empty field matches
// everything.
type Selector struct {
	// PathPrefix matches the request path without the query string.
	PathPrefix string
	// Methods are upper-case HTTP methods.
	Methods []string
	// Hosts are lower-case host names without port; "*.example.com" matches
	// any subdomain of example.com.
	Hosts []string
}

// Rule is one token-bucket limit.
type Rule struct {
	Name string
	// Keys are the descriptors whose values identify a bucket; none means one
	// bucket for every request the rule applies to.
	Keys []Descriptor
	// Limit is the bucket's refill rate and capacity.
	Limit bucket.Limit
	// Cost says how many tokens a request takes.
	Cost CostSource
	// Match lists descriptor values that must all hold for the rule to apply.
	Match []MatchCond
	// DenyOnStoreError reports whether a shared-data failure rejects the
	// request ("on_store_error": "deny") instead of failing open.
	DenyOnStoreError bool
	// MaxKeys bounds the shared-data keys the rule may create ("max_keys",
	// default Settings.MaxKeysPerRule): its buckets live in MaxKeys slots,
	// see sharedstate's "Bounded key space". 0 means one key per identity,
	// without bound. A rule without limit keys always has one key.
	MaxKeys int
	// windowStart is a fixed window's start mode (WindowAligned, ...).
	windowStart int
	// Delay is a token bucket's delayed admission (delay.go); waiting
	// counts the requests it holds on this worker.
	Delay   Delay
	waiting int

	// Cluster reports "scope": "cluster": the rule is decided by the
	// rate-limit service of Settings.RLS, across every proxy, instead of in
	// this proxy's shared data.
	Cluster bool
	// Lease is set for "mode": "lease" (cluster scope only): the rule is
	// decided from this process's allowance of leased tokens
	// (docs/lease.md); nil in exact mode.
	Lease *LeaseConfig

	// Settle is what the rule settles after the response (count_statuses,
	// reset_on_statuses, a cost the response reports); nil if nothing.
	Settle *SettleSpec
	// InFlight makes the rule a limit on requests in flight ("algorithm":
	// "concurrency") instead of a token bucket; nil for a bucket.
	InFlight *InFlightSpec

	maxKeysSet bool
	shadow     bool
	metrics    ruleMetrics
	plan       rulePlan // see plan.go
}

// MatchCond is one entry of a rule's "match" object.
type MatchCond struct {
	Descriptor Descriptor
	Value      string
}

// CostKind is where a request's cost comes from.
type CostKind int

// Cost sources.
const (
	CostFixed CostKind = iota
	CostHeader
	CostQuery
	// CostResponse is a cost the response reports (SettleSpec.Response):
	// admission takes SettleSpec.PreCharge.
	CostResponse
)

// CostSource says how many tokens a request takes.
type CostSource struct {
	Kind CostKind
	// Name is the lower-case header or the query parameter name.
	Name string
	// Fixed is the cost for CostFixed ("fixed_cost", default 1).
	Fixed float64
	// Default is the cost when the header or parameter is absent or not a
	// positive finite number ("default_cost", default 1); for CostResponse,
	// the cost when the response reports none.
	Default float64
	// PreCharge is what CostResponse takes at admission (SettleSpec.PreCharge).
	PreCharge float64
}

const (
	defaultMaxAttempts = sharedstate.DefaultMaxAttempts
	maxMaxAttempts     = 1000
	maxXFFHops         = 10
	// DefaultMaxKeys is the default key bound of a rule with limit keys.
	DefaultMaxKeys = 65536
	maxMaxKeys     = 1 << 24
	maxNameLen     = 64
	maxLimitKeys   = 8
	// MaxRules bounds the rules of one configuration, fallback limits
	// included: every applying rule costs each request a shared-data
	// update (see docs/configuration.md for the measured cost).
	MaxRules = 256
	// maxRate and maxBurst keep the "tokens:last_refill" value short and
	// exact at 6 decimals.
	maxRate  = 1e9
	maxBurst = 1e12
	// maxFillTime bounds burst/rate, the seconds an empty bucket takes to
	// refill (about 31.7 years), so that every header fits an integer.
	maxFillTime = 1e9
)

// ConfigError is a configuration problem at a JSON path such as
// "policies[0].spec.rules[1].algorithm_config.burst".
type ConfigError struct {
	Path string
	Msg  string
}

// Error returns "path: message".
func (e *ConfigError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

func errAt(path, msg string) error { return &ConfigError{Path: path, Msg: msg} }

// ParseConfig parses and validates a plugin configuration in any of its three
// shapes: one rule, {"rules": [...]}, or a policy bundle
// {"bundle_version": 1, "policies": [...]}. It is strict: unknown fields,
// wrong types and out-of-range values are errors naming the field's path.
func ParseConfig(data []byte) (*Config, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, errAt("", "configuration is empty")
	}
	if !ljson.Valid(data) {
		return nil, errAt("", "configuration is not valid JSON: "+ljson.SyntaxError(data))
	}
	root := ljson.ParseBytes(data)
	if !root.IsObject() {
		return nil, errAt("", "configuration must be a JSON object, got "+typeName(root))
	}
	p := parser{names: map[string]string{}, metricNames: map[string]claimed{}}
	cfg := &Config{Settings: Settings{MaxAttempts: defaultMaxAttempts, MaxKeysPerRule: DefaultMaxKeys, ResponseSettings: defaultResponseSettings()}}
	var err error
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
	for _, pol := range cfg.Policies {
		for _, r := range pol.Rules {
			r.shadow = pol.Shadow
			cfg.rules = append(cfg.rules, r)
		}
		if pol.Fallback != nil {
			pol.Fallback.shadow = pol.Shadow
			cfg.rules = append(cfg.rules, pol.Fallback)
		}
	}
	for _, r := range cfg.rules {
		if !r.maxKeysSet {
			r.MaxKeys = cfg.Settings.MaxKeysPerRule
		}
		if len(r.Keys) == 0 {
			r.MaxKeys = 0
		}
	}
	if len(cfg.rules) == 0 && len(cfg.RLSDescriptors) == 0 {
		return nil, errAt("", "configuration has no rules")
	}
	if err := checkClusterRules(cfg); err != nil {
		return nil, err
	}
	if len(cfg.rules) > MaxRules {
		return nil, errAt("", "has "+strconv.Itoa(len(cfg.rules))+" rules (fallback limits included); at most "+
			strconv.Itoa(MaxRules)+" are allowed, since every applying rule costs each request a shared-data update")
	}
	for _, r := range cfg.rules {
		r.compile()
	}
	return cfg, nil
}

type parser struct {
	names       map[string]string  // rule name → path where it was defined
	metricNames map[string]claimed // rule name with '-' as '_' → its rule
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
	if !v.IsObject() {
		return nil, errAt(path, "must be an object, got "+typeName(v))
	}
	if err := onlyFields(path, v, "id", "spec"); err != nil {
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
	if !v.IsObject() {
		return s, errAt(path, "must be an object, got "+typeName(v))
	}
	if err := onlyFields(path, v, "pathPrefix", "methods", "hosts"); err != nil {
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
		return strings.ToUpper(m), isToken(m)
	}); err != nil {
		return s, err
	}
	s.Hosts, err = stringList(path+".hosts", v.Get("hosts"), func(h string) (string, bool) {
		// A wildcard is only a whole leading label: "*.example.com".
		wild := strings.IndexByte(h, '*')
		ok := h != "" && !strings.ContainsAny(h, " /:\t") &&
			(wild < 0 || wild == 0 && strings.HasPrefix(h, "*.") && len(h) > 2 && strings.Count(h, "*") == 1)
		return strings.ToLower(h), ok
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
	if !v.IsObject() {
		return nil, errAt(path, "must be an object, got "+typeName(v))
	}
	fields := []string{"name", "limit_keys", "algorithm", "algorithm_config", "on_store_error", "max_keys", "scope", "mode", "lease_max", "lease_ttl_ms"}
	if !fallback {
		fields = append(fields, "match")
	}
	if err := onlyFields(path, v, fields...); err != nil {
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
	fixedWindow, concurrency := false, false
	if a := v.Get("algorithm"); a.Exists() {
		switch {
		case a.Type == ljson.String && a.Str == "token_bucket":
		case a.Type == ljson.String && a.Str == "fixed_window":
			fixedWindow = true
		case a.Type == ljson.String && a.Str == "concurrency":
			concurrency = true
		default:
			return nil, errAt(join(path, "algorithm"), `unknown algorithm `+short(a.Raw)+`, want "token_bucket", "fixed_window" or "concurrency"`)
		}
	}
	if keys := v.Get("limit_keys"); keys.Exists() {
		kpath := join(path, "limit_keys")
		if !keys.IsArray() {
			return nil, errAt(kpath, "must be an array of descriptors, got "+typeName(keys))
		}
		var err error
		keys.ForEach(func(k, e ljson.Result) bool {
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
			return nil, err
		}
		if len(r.Keys) > maxLimitKeys {
			return nil, errAt(kpath, "at most "+strconv.Itoa(maxLimitKeys)+" descriptors")
		}
	}
	if concurrency {
		if err := concurrencyConfig(join(path, "algorithm_config"), v.Get("algorithm_config"), r); err != nil {
			return nil, err
		}
	} else if fixedWindow {
		if err := windowConfig(join(path, "algorithm_config"), v.Get("algorithm_config"), r); err != nil {
			return nil, err
		}
	} else if err := algorithmConfig(join(path, "algorithm_config"), v.Get("algorithm_config"), r); err != nil {
		return nil, err
	}
	if m := v.Get("match"); m.Exists() {
		mpath := join(path, "match")
		if !m.IsObject() {
			return nil, errAt(mpath, "must be an object of descriptor → value, got "+typeName(m))
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
		if err != nil {
			return nil, err
		}
	}
	if mk := v.Get("max_keys"); mk.Exists() {
		n, err := maxKeys(join(path, "max_keys"), mk)
		if err != nil {
			return nil, err
		}
		r.MaxKeys, r.maxKeysSet = n, true
	}
	switch sc := v.Get("scope"); {
	case !sc.Exists():
	case sc.Type == ljson.String && sc.Str == "local":
	case sc.Type == ljson.String && sc.Str == "cluster":
		r.Cluster = true
	default:
		return nil, errAt(join(path, "scope"), `must be "local" or "cluster", got `+short(sc.Raw))
	}
	if err := r.leaseFields(path, v); err != nil {
		return nil, err
	}
	switch ose := v.Get("on_store_error"); {
	case !ose.Exists():
	case ose.Type == ljson.String && ose.Str == "allow":
	case ose.Type == ljson.String && ose.Str == "deny":
		r.DenyOnStoreError = true
	default:
		return nil, errAt(join(path, "on_store_error"), `must be "allow" or "deny", got `+short(ose.Raw))
	}
	return r, nil
}

// Window start modes of a fixed window ("window_start").
const (
	WindowAligned = iota // windows start at multiples of window_seconds since the epoch
	WindowHash           // each key's windows start at an offset its hash chooses
	WindowRandom         // each key's windows start at an offset drawn when it is created
)

// maxWindow bounds window_seconds (about 31 years); minWindow is its
// lower bound, one millisecond: a window's start is stored in microseconds,
// and a "hash" start is the key's hash modulo the window in microseconds,
// which a shorter window would round to zero.
const (
	maxWindow = 1e9
	minWindow = 1e-3
)

// windowConfig reads a fixed window's algorithm_config: limit tokens per
// window of window_seconds, a rollover capacity (default limit) and where
// windows start.
func windowConfig(path string, v ljson.Result, r *Rule) error {
	if !v.Exists() {
		return errAt(path, "is required")
	}
	if !v.IsObject() {
		return errAt(path, "must be an object, got "+typeName(v))
	}
	if err := onlyFields(path, v, "limit", "window_seconds", "capacity", "window_start", "cost_source", "fixed_cost", "default_cost", "count_statuses", "reset_on_statuses"); err != nil {
		return err
	}
	need := func(field string, max float64) (float64, error) {
		f := v.Get(field)
		if !f.Exists() {
			return 0, errAt(path+"."+field, "is required")
		}
		return positive(path+"."+field, f, max)
	}
	limit, err := need("limit", maxBurst)
	if err != nil {
		return err
	}
	window, err := need("window_seconds", maxWindow)
	if err != nil {
		return err
	}
	if window < minWindow {
		return errAt(path+".window_seconds", "must be >= "+num(minWindow)+" (one millisecond), got "+num(window))
	}
	capacity := limit
	if c := v.Get("capacity"); c.Exists() {
		if capacity, err = positive(path+".capacity", c, maxBurst); err != nil {
			return err
		}
	}
	switch ws := v.Get("window_start"); {
	case !ws.Exists(), ws.Type == ljson.String && ws.Str == "aligned":
	case ws.Type == ljson.String && ws.Str == "hash":
		r.windowStart = WindowHash
	case ws.Type == ljson.String && ws.Str == "random":
		r.windowStart = WindowRandom
	default:
		return errAt(path+".window_start", `must be "aligned", "hash" or "random", got `+short(ws.Raw))
	}
	r.Limit = bucket.Limit{Rate: limit, Burst: capacity, Window: window}
	return costConfig(path, v, r)
}

func algorithmConfig(path string, v ljson.Result, r *Rule) error {
	if !v.Exists() {
		return errAt(path, "is required")
	}
	if !v.IsObject() {
		return errAt(path, "must be an object, got "+typeName(v))
	}
	if err := onlyFields(path, v, append([]string{"tokens_per_second", "rps", "burst", "cost_source", "fixed_cost", "default_cost",
		"count_statuses", "reset_on_statuses", "pre_charge", "max_debt"}, delayFields...)...); err != nil {
		return err
	}
	tps, rps := v.Get("tokens_per_second"), v.Get("rps")
	rateField := "tokens_per_second"
	switch {
	case tps.Exists() && rps.Exists():
		return errAt(path, "set tokens_per_second or its alias rps, not both")
	case rps.Exists():
		tps, rateField = rps, "rps"
	case !tps.Exists():
		return errAt(path, "needs tokens_per_second (or its alias rps)")
	}
	rate, err := positive(path+"."+rateField, tps, maxRate)
	if err != nil {
		return err
	}
	b := v.Get("burst")
	if !b.Exists() {
		return errAt(path+".burst", "is required")
	}
	burst, err := positive(path+".burst", b, maxBurst)
	if err != nil {
		return err
	}
	r.Limit = bucket.Limit{Rate: rate, Burst: burst}
	if err := delayConfig(path, v, r); err != nil {
		return err
	}
	// A shaping rule (max_reserved) may let less than a second's worth
	// through at once, as nginx's burst does.
	if burst < rate && r.Delay.MaxReserved == 0 {
		return errAt(path+".burst", "must be >= "+rateField+" ("+num(rate)+"), got "+num(burst))
	}
	if burst/rate > maxFillTime {
		return errAt(path+"."+rateField, "must be >= burst/1e9 ("+num(burst/maxFillTime)+
			") so that an empty bucket refills within 1e9 seconds, got "+num(rate))
	}
	return costConfig(path, v, r)
}

// costConfig reads the cost fields both algorithms share, then refuses a
// rule that could never admit a request.
func costConfig(path string, v ljson.Result, r *Rule) error {
	var err error
	r.Cost = CostSource{Kind: CostFixed, Fixed: 1, Default: 1}
	if fc := v.Get("fixed_cost"); fc.Exists() {
		if r.Cost.Fixed, err = positive(path+".fixed_cost", fc, maxBurst); err != nil {
			return err
		}
	}
	if dc := v.Get("default_cost"); dc.Exists() {
		if r.Cost.Default, err = positive(path+".default_cost", dc, maxBurst); err != nil {
			return err
		}
	}
	if cs := v.Get("cost_source"); cs.Exists() {
		if cs.Type != ljson.String {
			return errAt(path+".cost_source", "must be a string, got "+typeName(cs))
		}
		if resp, err := responseCost(path+".cost_source", cs.Str, r); err != nil {
			return err
		} else if !resp {
			kind, name, ok := parseCostSource(cs.Str)
			if !ok {
				return errAt(path+".cost_source", `must be "fixed", "header:<name>", "query:<name>", "response_header:<name>", `+
					`"response_json:<JSON pointer>" or "response_sse:<JSON pointer>", got `+strconv.Quote(clip(cs.Str)))
			}
			r.Cost.Kind, r.Cost.Name = kind, name
		}
	}
	if err := settleConfig(path, v, r); err != nil {
		return err
	}
	return admissible(path, v, r)
}

// admissible refuses a rule that could never admit a request: one whose
// every request costs more than its bucket can hold.
func admissible(path string, v ljson.Result, r *Rule) error {
	burst := r.Limit.Burst
	never := " or no request can ever pass"
	cap := "burst"
	if r.Limit.Window > 0 {
		cap = "capacity" // a fixed window's
	}
	if r.Cost.Kind == CostFixed && r.Cost.Fixed > burst {
		if !v.Get("fixed_cost").Exists() {
			return errAt(path+"."+cap, "must be >= the cost of a request (1, the default fixed_cost)"+never+", got "+num(burst))
		}
		return errAt(path+".fixed_cost", "must be <= "+cap+" ("+num(burst)+")"+never+", got "+num(r.Cost.Fixed))
	}
	if r.Cost.Default > burst && (r.Cost.Kind != CostFixed || v.Get("default_cost").Exists()) {
		if !v.Get("default_cost").Exists() {
			return errAt(path+"."+cap, "must be >= default_cost (1, the default), the cost of a request without "+
				"a valid cost,"+never+" without one, got "+num(burst))
		}
		return errAt(path+".default_cost", "must be <= "+cap+" ("+num(burst)+")"+never+" without a valid cost, got "+num(r.Cost.Default))
	}
	return nil
}

func parseCostSource(s string) (CostKind, string, bool) {
	if s == "fixed" {
		return CostFixed, "", true
	}
	kind, name, ok := strings.Cut(s, ":")
	if !ok || !validName(name) {
		return 0, "", false
	}
	switch kind {
	case "header":
		return CostHeader, strings.ToLower(name), true
	case "query":
		return CostQuery, name, true
	}
	return 0, "", false
}

func (p *parser) settings(cfg *Config, v ljson.Result) error {
	if !v.Exists() {
		return nil
	}
	if !v.IsObject() {
		return errAt("settings", "must be an object, got "+typeName(v))
	}
	if err := onlyFields("settings", v, append([]string{"cas_max_attempts", "xff_trusted_hops", "xff_trusted_cidrs", "jwt_payload_in_metadata", "rls", "max_keys_per_rule"}, responseSettingFields...)...); err != nil {
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
		if !ok || n < 0 || n > maxXFFHops {
			return errAt("settings.xff_trusted_hops", "must be an integer from 0 to "+strconv.Itoa(maxXFFHops)+", got "+short(h.Raw))
		}
		cfg.Settings.XFFTrustedHops = int(n)
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
//
// Names that differ only by '-' versus '_' are refused too: Prometheus
// replaces '-' with '_', so their metrics would collide.
func (p *parser) claim(path, name string) error {
	if prev, ok := p.names[name]; ok {
		return errAt(path, "duplicate rule name "+strconv.Quote(name)+" (first used at "+prev+")")
	}
	metric := strings.ReplaceAll(name, "-", "_")
	if prev, ok := p.metricNames[metric]; ok {
		return errAt(path, "rule name "+strconv.Quote(name)+" has the same metric name as "+
			strconv.Quote(prev.name)+" (at "+prev.path+"): Prometheus turns '-' into '_'")
	}
	p.names[name] = path
	p.metricNames[metric] = claimed{name, path}
	return nil
}

type claimed struct{ name, path string }

func requiredName(path string, v ljson.Result) (string, error) {
	if !v.Exists() {
		return "", errAt(path, "is required")
	}
	if v.Type != ljson.String {
		return "", errAt(path, "must be a string, got "+typeName(v))
	}
	if !validName(v.Str) {
		return "", errAt(path, "must be 1 to 64 characters from [A-Za-z0-9_-], got "+strconv.Quote(clip(v.Str)))
	}
	return v.Str, nil
}

// validName reports whether s is 1 to 64 characters from [A-Za-z0-9_-].
func validName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// positive returns v as a finite number in (0, max].
func positive(path string, v ljson.Result, max float64) (float64, error) {
	if v.Type != ljson.Number {
		return 0, errAt(path, "must be a number, got "+typeName(v))
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, errAt(path, "must be a finite number, got "+short(v.Raw))
	}
	if f <= 0 {
		return 0, errAt(path, "must be > 0, got "+num(f))
	}
	if f > max {
		return 0, errAt(path, "must be <= "+num(max)+", got "+num(f))
	}
	return f, nil
}

func integer(v ljson.Result) (int64, bool) {
	if v.Type != ljson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	return n, err == nil
}

// onlyFields rejects any key of obj not in allowed.
func onlyFields(path string, obj ljson.Result, allowed ...string) error {
	var err error
	seen := map[string]bool{}
	obj.ForEach(func(k, _ ljson.Result) bool {
		if seen[k.Str] {
			err = errAt(join(path, k.Str), "duplicate field")
			return false
		}
		seen[k.Str] = true
		for _, a := range allowed {
			if k.Str == a {
				return true
			}
		}
		err = errAt(join(path, k.Str), "unknown field (allowed: "+strings.Join(allowed, ", ")+")")
		return false
	})
	return err
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func typeName(v ljson.Result) string {
	switch {
	case !v.Exists():
		return "nothing"
	case v.IsArray():
		return "an array"
	case v.IsObject():
		return "an object"
	}
	switch v.Type {
	case ljson.String:
		return "a string"
	case ljson.Number:
		return "a number"
	case ljson.True, ljson.False:
		return "a boolean"
	case ljson.Null:
		return "null"
	}
	return "an unknown value"
}

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// short is clip for raw JSON.
func short(raw string) string { return clip(raw) }

var errEmptyDescriptor = errors.New("descriptor is empty")

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
