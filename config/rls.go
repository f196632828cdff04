package config

import (
	"math"
	"strconv"

	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// RLSSettings name the rate-limit service (Envoy's RLS v3 API) that decides
// cluster-scope rules, and what to do when it cannot answer.
type RLSSettings struct {
	_ incomparable
	// Cluster is the Envoy cluster the call goes to: an HTTP/2 cluster for
	// Protocol gRPC (unary gRPC carried by proxy_http_call), any HTTP
	// cluster for JSON.
	Cluster string
	// Protocol is how the call is carried: RLSProtocolGRPC (the default)
	// or RLSProtocolJSON, JSON over HTTP/1.1 to the service's /json.
	Protocol RLSProtocol
	// Authority is the call's :authority; the cluster name by default.
	Authority string
	// Domain is RateLimitRequest.domain ("tokengate" by default).
	Domain string
	// TimeoutMs bounds the call (default 60, at most 10000): above twice
	// tokengate-rls's -redis-timeout (25 ms) plus the network, since a
	// decision may take two Redis round trips (docs/rls.md#timeouts).
	TimeoutMs uint32
	// OnError is what a request gets when the service fails, times out or
	// answers something unusable: OnErrorAllow (the default) lets it
	// through; OnErrorDeny answers 503; OnErrorLocal decides the cluster
	// rules in this proxy's shared data instead.
	OnError RLSOnError
	// LeaseTickMs is the refill period of lease-mode rules, the tick
	// period of every worker when one exists (default 100).
	LeaseTickMs uint32
	// LeaseFallbackMs is how long the lease calls of a bucket must have
	// been failing, with no answer between, before the requests its
	// allowance cannot cover get OnError (default 5 × LeaseTickMs, 0: at
	// the first failure). Until then they wait for the next call: a
	// transient failure never sends them to a fallback that admits beyond
	// the fleet's bucket (docs/lease.md#failures-path-by-path).
	LeaseFallbackMs uint32
	// Credential, when not empty, is sent with every call as
	// "authorization: Bearer <credential>": tokengate-rls accepts
	// settlements and lease calls only from callers that carry one of its
	// -credential-file's (docs/rls.md#trust-model). 1 to 256 bytes here;
	// the service accepts only 16 or more visible ASCII characters.
	Credential string
}

// RLSProtocol is settings.rls.protocol.
type RLSProtocol int

// How the RLS call is carried over proxy_http_call.
const (
	// RLSProtocolGRPC is unary gRPC (RateLimitService/ShouldRateLimit,
	// protobuf) on an HTTP/2 cluster.
	RLSProtocolGRPC RLSProtocol = iota
	// RLSProtocolJSON is POST /json with the RateLimitRequest in protobuf's
	// JSON form, answered 200 (OK) or 429 (OVER_LIMIT) with the
	// RateLimitResponse: envoyproxy/ratelimit's HTTP endpoint, which
	// tokengate-rls serves on its admin listener.
	RLSProtocolJSON
)

// RLSOnError is settings.rls.on_error.
type RLSOnError int

// What a request gets when the rate-limit service fails.
const (
	OnErrorAllow RLSOnError = iota
	OnErrorDeny
	OnErrorLocal
)

const (
	defaultRLSTimeoutMs = 60
	maxRLSTimeoutMs     = 10000
)

func rlsSettings(path string, v ljson.Result) (*RLSSettings, error) {
	if err := fields(path, v, "cluster", "authority", "domain", "timeout_ms", "on_error", "protocol", "lease_tick_ms", "lease_fallback_ms", "credential"); err != nil {
		return nil, err
	}
	s := &RLSSettings{Domain: "tokengate", TimeoutMs: defaultRLSTimeoutMs, LeaseTickMs: defaultLeaseTickMs}
	str := func(field string, dst *string, required bool) error {
		f := v.Get(field)
		if !f.Exists() {
			if required {
				return errAt(join(path, field), "is required")
			}
			return nil
		}
		if f.Type != ljson.String || f.Str == "" || len(f.Str) > 256 {
			got := short(f.Raw)
			if field == "credential" {
				got = "something else (a secret: not shown)"
			}
			return errAt(join(path, field), "must be a string of 1 to 256 bytes, got "+got)
		}
		*dst = f.Str
		return nil
	}
	if err := str("cluster", &s.Cluster, true); err != nil {
		return nil, err
	}
	s.Authority = s.Cluster
	if err := str("authority", &s.Authority, false); err != nil {
		return nil, err
	}
	if err := str("domain", &s.Domain, false); err != nil {
		return nil, err
	}
	if t := v.Get("timeout_ms"); t.Exists() {
		n, ok := integer(t)
		if !ok || n < 1 || n > maxRLSTimeoutMs {
			return nil, errAt(join(path, "timeout_ms"), "must be an integer from 1 to "+strconv.Itoa(maxRLSTimeoutMs)+", got "+short(t.Raw))
		}
		s.TimeoutMs = uint32(n)
	}
	if t := v.Get("lease_tick_ms"); t.Exists() {
		n, ok := integer(t)
		if !ok || n < 10 || n > 10000 {
			return nil, errAt(join(path, "lease_tick_ms"), "must be an integer from 10 to 10000, got "+short(t.Raw))
		}
		s.LeaseTickMs = uint32(n)
	}
	s.LeaseFallbackMs = defaultLeaseFallbackTicks * s.LeaseTickMs
	if t := v.Get("lease_fallback_ms"); t.Exists() {
		n, ok := integer(t)
		if !ok || n < 0 || n > maxLeaseFallbackMs {
			return nil, errAt(join(path, "lease_fallback_ms"), "must be an integer from 0 to "+strconv.Itoa(maxLeaseFallbackMs)+", got "+short(t.Raw))
		}
		s.LeaseFallbackMs = uint32(n)
	}
	if err := str("credential", &s.Credential, false); err != nil {
		return nil, err
	}
	// OnErrorAllow, OnErrorDeny, OnErrorLocal in order.
	oe, err := choice(join(path, "on_error"), v.Get("on_error"), "allow", "deny", "local")
	if err != nil {
		return nil, err
	}
	s.OnError = RLSOnError(oe)
	switch p := v.Get("protocol"); {
	case !p.Exists(), p.Type == ljson.String && p.Str == "grpc":
	case p.Type == ljson.String && p.Str == "json":
		s.Protocol = RLSProtocolJSON
	default:
		return nil, errAt(join(path, "protocol"), `must be "grpc" (unary gRPC on an HTTP/2 cluster) or "json" (JSON over HTTP/1.1 to /json), got `+short(p.Raw))
	}
	return s, nil
}

// checkClusterRules refuses cluster-scope rules without a service to ask.
// single reports whether the file is one bare rule, a shape that holds no
// settings.
func checkClusterRules(cfg *Config, single bool) error {
	for _, r := range cfg.rules {
		if r.Cluster && cfg.Settings.RLS == nil && single {
			return errAt("scope", `"cluster" needs settings.rls (the rate-limit service to ask), and a file of one bare rule has no settings: `+
				`write it as {"rules": [<the rule>], "settings": {"rls": {"cluster": "<Envoy cluster of the service>"}}}`)
		}
		if r.Cluster && cfg.Settings.RLS == nil {
			return errAt("settings.rls", "is required: rule "+strconv.Quote(r.Name)+` has "scope": "cluster"`)
		}
		if r.Cluster && r.InFlight != nil {
			return errAt("", "rule "+strconv.Quote(r.Name)+`: "scope": "cluster" cannot count requests in flight: `+
				`a count in the service would need a release call per request and would leak what a dead proxy held; `+
				`use "scope": "local" for a concurrency rule (docs/rls.md)`)
		}
		if r.Cluster && r.Cost.Estimate == CostRequestJSON {
			return errAt("", "rule "+strconv.Quote(r.Name)+`: "scope": "cluster" cannot take its estimate from the request body `+
				`("estimate_source": "request_json:..."): the service decides when the headers arrive; state the estimate in a header `+
				`("header:<name>") or make the rule local (docs/configuration.md)`)
		}
		if r.Lease != nil && r.Settle != nil {
			return errAt("", "rule "+strconv.Quote(r.Name)+`: "mode": "lease" cannot settle after the response `+
				`(count_statuses, reset_on_statuses, response_* costs): a refund into an allowance would race with the `+
				`service's accounting of it; use "mode": "exact", which settles in the service (docs/rls.md)`)
		}
		if r.Cluster && r.DenyOnStoreError && cfg.Settings.RLS.OnError != OnErrorLocal {
			// The service's failure is settings.rls.on_error's; the rule's
			// on_store_error only decides when on_error "local" moves the
			// rule into this proxy's shared data. Accepted, "deny" would
			// promise a closed failure the rule never gives (issue 22).
			return errAt("", "rule "+strconv.Quote(r.Name)+`: "on_store_error": "deny" on a "scope": "cluster" rule applies only `+
				`with settings.rls.on_error "local" (a shared-data failure while the rule is decided locally); `+
				`a failure of the rate-limit service is settings.rls.on_error's: set it to "deny" (docs/failures.md)`)
		}
		if r.Cluster && r.Limit.Window > 0 {
			return errAt("", "rule "+strconv.Quote(r.Name)+`: "scope": "cluster" decides token buckets only, not fixed windows`)
		}
		if r.Lease != nil {
			if err := r.Lease.check(r, cfg.Settings.RLS); err != nil {
				return err
			}
		}
	}
	return nil
}

// LeaseConfig is a lease-mode rule's lease settings (docs/lease.md).
type LeaseConfig struct {
	_ incomparable
	// Max is the largest allowance a process asks for, in tokens
	// ("lease_max", default max(1, burst/10)).
	Max float64
	// TTL is how long a grant may be spent, in seconds ("lease_ttl_ms",
	// default 2000 ms).
	TTL float64
}

const (
	defaultLeaseTickMs = 100
	defaultLeaseTTLMs  = 2000
	// defaultLeaseFallbackTicks is lease_fallback_ms's default in refill
	// periods: five calls in a row failed.
	defaultLeaseFallbackTicks = 5
	maxLeaseFallbackMs        = 60000
)

// leaseFields parses "mode", "lease_max" and "lease_ttl_ms" into r; the
// checks that need the rule's limit and settings.rls, and lease_max's
// default, are in LeaseConfig.check.
func leaseFields(path string, v ljson.Result, r *Rule) error {
	switch m, err := choice(join(path, "mode"), v.Get("mode"), "exact", "lease"); {
	case err != nil:
		return err
	case m == 1 && !r.Cluster:
		return errAt(join(path, "mode"), `"lease" needs "scope": "cluster"`)
	case m == 1:
		r.Lease = &LeaseConfig{TTL: defaultLeaseTTLMs / 1000.0}
	}
	for _, f := range []string{"lease_max", "lease_ttl_ms"} {
		if v.Get(f).Exists() && r.Lease == nil {
			return errAt(join(path, f), `needs "mode": "lease"`)
		}
	}
	if r.Lease == nil {
		return nil
	}
	if m := v.Get("lease_max"); m.Exists() {
		n, ok := integer(m)
		if !ok || n < 1 || n > 1<<30 {
			return errAt(join(path, "lease_max"), "must be an integer from 1 to 1073741824 (tokens), got "+short(m.Raw))
		}
		r.Lease.Max = float64(n)
	}
	if t := v.Get("lease_ttl_ms"); t.Exists() {
		n, ok := integer(t)
		if !ok || n < 100 || n > 60000 {
			return errAt(join(path, "lease_ttl_ms"), "must be an integer from 100 to 60000, got "+short(t.Raw))
		}
		r.Lease.TTL = float64(n) / 1000
	}
	return nil
}

// check completes and validates a lease rule's settings against its limit
// and settings.rls; a Max of 0 is lease_max left out (it is at least 1).
func (l *LeaseConfig) check(r *Rule, rls *RLSSettings) error {
	name := "rule " + strconv.Quote(r.Name)
	if l.Max == 0 {
		l.Max = math.Max(1, math.Floor(r.Limit.Burst/10))
	}
	if l.Max > r.Limit.Burst {
		return errAt("", name+": lease_max ("+strconv.FormatFloat(l.Max, 'f', -1, 64)+") must not exceed the burst ("+strconv.FormatFloat(r.Limit.Burst, 'f', -1, 64)+")")
	}
	minTTL := 2*float64(rls.LeaseTickMs)/1000 + float64(rls.TimeoutMs)/1000
	if l.TTL <= minTTL {
		return errAt("", name+": lease_ttl_ms ("+strconv.FormatFloat(l.TTL*1000, 'f', -1, 64)+") must exceed twice settings.rls.lease_tick_ms plus settings.rls.timeout_ms ("+strconv.FormatFloat(minTTL*1000, 'f', -1, 64)+")")
	}
	return nil
}
