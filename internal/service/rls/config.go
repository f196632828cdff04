// Package rls is tokengate-rls: Envoy's rate-limit service API (RLS v3,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) deciding
// continuous token buckets and calendar quotas whose state lives in Redis
// or a Redis Cluster.
//
// It reads the filter's JSON configuration (config.Parse): the rules
// with "scope": "cluster", which the filter asks about with one descriptor
// per rule, [{"tokengate_rule", <rule>}, {"key", <composite key>}], and the
// "rls_descriptors" trees that map descriptors of Envoy's own ratelimit
// filter to token buckets. docs/rls.md describes both, the Redis state and
// the failure behaviour.
package rls

import (
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/ratelimitheader"
	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// Config is one configuration in force: the rules it decides (for the
// metrics and RLQS) and the kind of configuration that answers its calls,
// chosen once, when it is made: tokengate's JSON (ParseConfig, its tables
// in jsonRules), envoyproxy/ratelimit's YAML or xDS (NewDropinConfig, its
// tree in dropin) or none (Unloaded).
type Config struct {
	// File is the parsed JSON configuration (empty for a drop-in's).
	File *config.Config
	// rules are every rule the service can decide, in configuration order.
	rules []*config.Rule
	// kind answers the calls (decide.go).
	kind decider
	// jsonRules are tokengate's tables: empty unless the kind is
	// tokengate's.
	jsonRules
	// dropin is envoyproxy/ratelimit's tree: nil unless the kind is the
	// drop-in's.
	dropin *dropin
}

// jsonRules are the tables of a tokengate JSON configuration.
type jsonRules struct {
	// cluster are the rules with "scope": "cluster", by name.
	cluster map[string]*config.Rule
	// domains are the rls_descriptors trees, by domain.
	domains map[string][]*config.RLSDescriptor
	// limitArgs are each rule's rate and burst as the Redis scripts'
	// arguments, formatted once.
	limitArgs map[*config.Rule]*[2]string
	// plans are each rule's RateLimit header plan, formatted once.
	plans map[*config.Rule]*ratelimitheader.Plan
	// quotas are the quota rules' zones and thresholds (quota.go).
	quotas map[*config.Rule]*quotaRule
}

// Unloaded returns the configuration of a drop-in whose runtime directory
// did not load at start and which was asked to serve anyway
// (TOKENGATE_BAD_CONFIG_AT_START=serve, docs/dropin.md): every call is
// answered with an error, "no rate limit configuration loaded", as
// envoyproxy/ratelimit answers, until a configuration loads.
func Unloaded() *Config { return &Config{File: &config.Config{}, kind: unloadedKind{}} }

// ParseConfig parses a tokengate JSON configuration for the service. A
// configuration without a cluster rule or rls_descriptors parses, but no
// descriptor will ever be limited.
func ParseConfig(data []byte) (*Config, error) {
	f, err := config.Parse(data)
	if err != nil {
		return nil, err
	}
	c := &Config{File: f, jsonRules: jsonRules{cluster: map[string]*config.Rule{}, domains: map[string][]*config.RLSDescriptor{},
		quotas: map[*config.Rule]*quotaRule{}}}
	c.kind = tokengateKind{c}
	for _, r := range f.Rules() {
		if r.Cluster {
			c.cluster[r.Name] = r
			c.rules = append(c.rules, r)
		}
		if r.Quota != nil {
			q, err := loadQuota(r)
			if err != nil {
				return nil, err
			}
			c.quotas[r] = q
		}
	}
	for _, d := range f.RLSDescriptors {
		c.domains[d.Domain] = d.Descriptors
		walk(d.Descriptors, func(n *config.RLSDescriptor) {
			if n.Rule != nil {
				c.rules = append(c.rules, n.Rule)
			}
		})
	}
	c.limitArgs = make(map[*config.Rule]*[2]string, len(c.rules))
	c.plans = make(map[*config.Rule]*ratelimitheader.Plan, len(c.rules))
	for _, r := range c.rules {
		c.limitArgs[r] = &[2]string{redisstore.Num(r.Limit.Rate), redisstore.Num(r.Limit.Burst)}
		plan := ratelimitheader.NewPlan(r.Name, r.Limit)
		c.plans[r] = &plan
	}
	return c, nil
}

// Rules returns every rule the service decides: the cluster-scope rules,
// then the rls_descriptors rules, in configuration order.
func (c *Config) Rules() []*config.Rule { return c.rules }

func walk(ns []*config.RLSDescriptor, f func(*config.RLSDescriptor)) {
	for _, n := range ns {
		f(n)
		walk(n.Descriptors, f)
	}
}

// Entry is one descriptor entry, as the request carries it.
type Entry = rlscontract.Entry

// maxComposite bounds the composite key the filter sends: 8 limit keys of
// at most sharedstate.MaxValueLen bytes each, with their separators.
const maxComposite = 8 * (sharedstate.MaxValueLen + 1)

// Resolve returns the rule that decides a descriptor of domain and the
// Redis key of its bucket, or nil when no rule applies (the descriptor is
// then not limited).
//
//   - The filter's descriptor, [tokengate_rule=<rule>, key=<composite>],
//     names a cluster-scope rule of the configuration's domain
//     (settings.rls.domain, the one the filter sends); its bucket is the
//     composite key, which is sharedstate's, so the bucket has the
//     identity it has in shared data. In another domain it names nothing:
//     the domain selects a configuration, as in envoyproxy/ratelimit.
//   - Any other descriptor walks the domain's rls_descriptors tree; its
//     bucket is the composite key of all its entries' values.
func (c *Config) Resolve(domain string, entries []Entry) (*config.Rule, string) {
	if rule, comp, _, ok := rlscontract.ParseCluster(entries); ok {
		r := c.clusterRule(domain, rule)
		if r == nil {
			return nil, ""
		}
		return r, redisstore.BucketKey(r.Name, cleanComposite(comp))
	}
	nodes := c.domains[domain]
	if nodes == nil || len(entries) == 0 {
		return nil, ""
	}
	var n *config.RLSDescriptor
	for _, e := range entries {
		n = match(nodes, e)
		if n == nil {
			return nil, ""
		}
		nodes = n.Descriptors
	}
	if n.Rule == nil {
		return nil, ""
	}
	vals := make([]string, len(entries))
	for i, e := range entries {
		vals[i] = e.Value
	}
	return n.Rule, redisstore.BucketKey(n.Rule.Name, string(sharedstate.AppendComposite(nil, vals)))
}

// overrideRule returns the rule and bucket of a descriptor that carries
// Envoy's limit override of n per unit: a token bucket of burst n refilled
// at n per unit, named after the rule the descriptor matched (r, or
// "override" when none did), in a bucket of its own (the rule's name, then
// "@n/unit seconds"). A descriptor of a domain without rls_descriptors, a
// unit Envoy does not define or n = 0 keeps r and its key.
func (c *Config) overrideRule(domain string, r *config.Rule, key string, entries []Entry, n uint32, unit Unit) (*config.Rule, string) {
	secs := UnitSeconds(unit)
	if c.domains[domain] == nil || secs == 0 || n == 0 || len(entries) == 0 {
		return r, key
	}
	name := "override"
	if r != nil {
		name = r.Name
	}
	o := limitRule(name, n, secs, false)
	vals := make([]string, len(entries))
	for i, e := range entries {
		vals[i] = e.Value
	}
	suffix := "@" + strconv.FormatUint(uint64(n), 10) + "/" + strconv.FormatInt(secs, 10)
	return o, redisstore.BucketKey(name+suffix, string(sharedstate.AppendComposite(nil, vals)))
}

// planOf returns the RateLimit header plan of r, made now for a rule of
// no configuration (an override).
func (c *Config) planOf(r *config.Rule) *ratelimitheader.Plan {
	if p := c.plans[r]; p != nil {
		return p
	}
	p := ratelimitheader.NewPlan(r.Name, r.Limit)
	return &p
}

// clusterRule returns the cluster-scope rule name of domain: nil unless
// domain is the configuration's (settings.rls.domain, "tokengate" by
// default).
func (c *Config) clusterRule(domain, name string) *config.Rule {
	want := "tokengate"
	if c.File != nil && c.File.Settings.RLS != nil {
		want = c.File.Settings.RLS.Domain
	}
	if domain != want {
		return nil
	}
	return c.cluster[name]
}

// match returns the node for entry e: the one with its key and value, else
// the one with its key and no value.
func match(nodes []*config.RLSDescriptor, e Entry) *config.RLSDescriptor {
	var wild *config.RLSDescriptor
	for _, n := range nodes {
		if n.Key != e.Key {
			continue
		}
		if n.Value == e.Value {
			return n
		}
		if n.Value == "" {
			wild = n
		}
	}
	return wild
}

// cleanComposite returns the filter's composite key as it is when it is one
// (bytes AppendComposite writes, within its length bound), so that the
// bucket is named as in shared data; anything else is encoded as one value,
// which removes braces and bounds its length.
func cleanComposite(s string) string {
	if len(s) <= maxComposite && !strings.ContainsAny(s, "{}") && isPrintableASCII(s) {
		return s
	}
	return string(sharedstate.AppendComposite(nil, []string{s}))
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
