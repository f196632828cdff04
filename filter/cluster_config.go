package filter

import (
	"strconv"

	"github.com/tokengate/tokengate/internal/lite/ljson"
)

// RLSSettings name the rate-limit service (Envoy's RLS v3 API) that decides
// cluster-scope rules, and what to do when it cannot answer.
type RLSSettings struct {
	// Cluster is the Envoy cluster the call goes to (an HTTP/2 cluster:
	// the call is unary gRPC carried by proxy_http_call).
	Cluster string
	// Authority is the call's :authority; the cluster name by default.
	Authority string
	// Domain is RateLimitRequest.domain ("tokengate" by default).
	Domain string
	// TimeoutMs bounds the call (default 20, at most 10000).
	TimeoutMs uint32
	// OnError is what a request gets when the service fails, times out or
	// answers something unusable: OnErrorAllow (the default) lets it
	// through; OnErrorDeny answers 503; OnErrorLocal decides the cluster
	// rules in this proxy's shared data instead.
	OnError RLSOnError
}

// RLSOnError is settings.rls.on_error.
type RLSOnError int

// What a request gets when the rate-limit service fails.
const (
	OnErrorAllow RLSOnError = iota
	OnErrorDeny
	OnErrorLocal
)

const (
	defaultRLSTimeoutMs = 20
	maxRLSTimeoutMs     = 10000
)

func rlsSettings(path string, v ljson.Result) (*RLSSettings, error) {
	if !v.IsObject() {
		return nil, errAt(path, "must be an object, got "+typeName(v))
	}
	if err := onlyFields(path, v, "cluster", "authority", "domain", "timeout_ms", "on_error", "protocol"); err != nil {
		return nil, err
	}
	s := &RLSSettings{Domain: "tokengate", TimeoutMs: defaultRLSTimeoutMs}
	str := func(field string, dst *string, required bool) error {
		f := v.Get(field)
		if !f.Exists() {
			if required {
				return errAt(join(path, field), "is required")
			}
			return nil
		}
		if f.Type != ljson.String || f.Str == "" || len(f.Str) > 256 {
			return errAt(join(path, field), "must be a string of 1 to 256 bytes, got "+short(f.Raw))
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
	switch oe := v.Get("on_error"); {
	case !oe.Exists(), oe.Type == ljson.String && oe.Str == "allow":
	case oe.Type == ljson.String && oe.Str == "deny":
		s.OnError = OnErrorDeny
	case oe.Type == ljson.String && oe.Str == "local":
		s.OnError = OnErrorLocal
	default:
		return nil, errAt(join(path, "on_error"), `must be "allow", "deny" or "local", got `+short(oe.Raw))
	}
	switch p := v.Get("protocol"); {
	case !p.Exists(), p.Type == ljson.String && p.Str == "grpc":
	default:
		return nil, errAt(join(path, "protocol"), `must be "grpc" (unary gRPC over proxy_http_call), got `+short(p.Raw))
	}
	return s, nil
}

// checkClusterRules refuses cluster-scope rules without a service to ask.
func checkClusterRules(cfg *Config) error {
	for _, r := range cfg.rules {
		if r.Cluster && cfg.Settings.RLS == nil {
			return errAt("settings.rls", "is required: rule "+strconv.Quote(r.Name)+` has "scope": "cluster"`)
		}
		if r.Cluster && (r.Settle != nil || r.InFlight != nil) {
			return errAt("", "rule "+strconv.Quote(r.Name)+`: "scope": "cluster" cannot settle after the response `+
				`(count_statuses, reset_on_statuses, response_* costs) or count requests in flight: the rate-limit service `+
				`takes hits at admission only; use "scope": "local" for such a rule`)
		}
		if r.Cluster && r.Limit.Window > 0 {
			return errAt("", "rule "+strconv.Quote(r.Name)+`: "scope": "cluster" decides token buckets only, not fixed windows`)
		}
	}
	return nil
}
