package rls

import (
	"errors"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/sharedstate"
)

// This file holds the configuration of envoyproxy/ratelimit's kind (its
// YAML, read by package rlsyaml, or its xDS resources): domains of nested
// descriptors with calendar units, decided as token buckets (the default)
// or as that project's fixed windows (Algorithm FixedWindow). The decision
// itself is in dropin_server.go; docs/dropin.md describes both.

// Unit is a rate limit's unit, as Envoy's RateLimitResponse names it.
type Unit = rlsv3.RateLimitResponse_RateLimit_Unit

// UnitSeconds returns the length of a unit in seconds as envoyproxy/ratelimit
// counts it (a month is 30 days, a year 365), or 0 for an unknown unit.
func UnitSeconds(u Unit) int64 {
	switch u {
	case rlsv3.RateLimitResponse_RateLimit_SECOND:
		return 1
	case rlsv3.RateLimitResponse_RateLimit_MINUTE:
		return 60
	case rlsv3.RateLimitResponse_RateLimit_HOUR:
		return 3600
	case rlsv3.RateLimitResponse_RateLimit_DAY:
		return 86400
	case rlsv3.RateLimitResponse_RateLimit_WEEK:
		return 7 * 86400
	case rlsv3.RateLimitResponse_RateLimit_MONTH:
		return 30 * 86400
	case rlsv3.RateLimitResponse_RateLimit_YEAR:
		return 365 * 86400
	}
	return 0
}

// Algorithm is how a drop-in configuration's limits are decided.
type Algorithm int

const (
	// TokenBucket makes a limit of N per unit a bucket of burst N refilled
	// at N per unit (continuously), all or nothing across a request's
	// descriptors.
	TokenBucket Algorithm = iota
	// FixedWindow reproduces envoyproxy/ratelimit: a counter per
	// calendar-aligned window (the epoch divided into units), incremented
	// by every call, over the limit once it passes N.
	FixedWindow
)

// RateLimit is the rate_limit of one descriptor.
type RateLimit struct {
	// RequestsPerUnit and Unit are the limit: N per unit. Ignored when
	// Unlimited.
	RequestsPerUnit uint32
	Unit            Unit
	// Unlimited descriptors are answered OK without touching Redis, and
	// their replaces still apply.
	Unlimited bool
	// Name names the limit for replaces; Replaces are the names of the
	// limits this one removes from a request when both apply.
	Name     string
	Replaces []string
	// Shadow is the descriptor's shadow_mode: decided and counted, never
	// OVER_LIMIT.
	Shadow bool
	// DetailedMetric is the descriptor's detailed_metric: its decisions
	// are also counted in series named by the request's values
	// (tokengate_rls_detailed_*; metrics only, decisions do not change).
	DetailedMetric bool
}

// Descriptor is one node of a domain's descriptor tree.
type Descriptor struct {
	// Key is the entry key; Value, when not empty, the value it matches:
	// exactly, or, when it holds '*', as a pattern where each '*' matches
	// any run of characters. An empty Value matches any value, and each
	// value then has a limit of its own.
	Key, Value string
	// RateLimit, when not nil, limits descriptors that end here.
	RateLimit *RateLimit
	// ShareThreshold (envoyproxy/ratelimit's share_threshold) makes every
	// value this node's pattern matches count as one: the limit reached
	// through it (here or deeper) keys its counter, or its bucket, by the
	// pattern instead of the entry's value. Only a Key or Value holding
	// '*' may have it.
	ShareThreshold bool
	// Descriptors are the nodes the next entry is matched against.
	Descriptors []*Descriptor
}

// Domain is one domain's descriptor tree.
type Domain struct {
	Name        string
	Descriptors []*Descriptor
}

// HeaderNames are the names of the three response headers
// envoyproxy/ratelimit adds when LIMIT_RESPONSE_HEADERS_ENABLED is set.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// DropinOptions configure a drop-in configuration.
type DropinOptions struct {
	Algorithm Algorithm
	// CacheKeyPrefix is put before every fixed-window counter's key
	// (envoyproxy/ratelimit's CACHE_KEY_PREFIX): with the same prefix the
	// two services count in the same keys.
	CacheKeyPrefix string
	// Headers, when not nil, are added to every response that has a limit
	// (the descriptor closest to its limit).
	Headers *HeaderNames
	// GlobalShadow answers OK to every request (SHADOW_MODE): decisions
	// are made and counted, never enforced.
	GlobalShadow bool
}

// dropin is the decided form of a drop-in configuration.
type dropin struct {
	opt     DropinOptions
	domains map[string]*dnode
}

// dnode is a Descriptor ready for matching, keyed as envoyproxy/ratelimit
// keys it: by its composite key, "key_value", or "key" when it has no
// value.
type dnode struct {
	limit *dlimit
	// children are the next level's nodes by composite key; wild are
	// those whose composite key holds a '*', in file order, each split at
	// '*' into wildParts.
	children  map[string]*dnode
	wild      []*dnode
	wildKey   string
	wildParts []string
	// share is the node's share_threshold: an entry it matches as a
	// pattern is counted under the pattern (dropin.resolve).
	share bool
}

// dlimit is a RateLimit with what deciding it needs.
type dlimit struct {
	RateLimit
	// rule is the token bucket (burst N, N per unit), named by the limit's
	// path in the tree ("domain.key_value.key"), its metrics' name.
	rule   *config.Rule
	window int64 // UnitSeconds(Unit)
}

// NewDropinConfig returns the configuration deciding domains the way
// envoyproxy/ratelimit does (docs/dropin.md). It checks what that
// project's loader checks; the errors name the domain and the path of the
// descriptor.
func NewDropinConfig(domains []*Domain, opt DropinOptions) (*Config, error) {
	d := &dropin{opt: opt, domains: map[string]*dnode{}}
	c := &Config{File: &config.Config{}, dropin: d, kind: dropinKind{d}}
	for _, dom := range domains {
		if dom.Name == "" {
			return nil, errors.New("a domain with an empty name")
		}
		if d.domains[dom.Name] != nil {
			return nil, errors.New("duplicate domain " + strconv.Quote(dom.Name))
		}
		root := &dnode{}
		if err := c.addNodes(root, dom.Name, dom.Descriptors); err != nil {
			return nil, err
		}
		d.domains[dom.Name] = root
	}
	return c, nil
}

func (c *Config) addNodes(parent *dnode, path string, ds []*Descriptor) error {
	for _, ds := range ds {
		if ds.Key == "" {
			return errors.New(path + ": a descriptor with an empty key")
		}
		id := ds.Key
		if ds.Value != "" {
			id += "_" + ds.Value
		}
		p := path + "." + id
		if parent.children[id] != nil {
			return errors.New(p + ": duplicate descriptor")
		}
		n := &dnode{share: ds.ShareThreshold}
		if ds.ShareThreshold && !strings.Contains(id, "*") {
			return errors.New(p + ": share_threshold: the key or value must hold a '*'")
		}
		if strings.Contains(id, "*") {
			n.wildKey, n.wildParts = id, strings.Split(id, "*")
			parent.wild = append(parent.wild, n)
		}
		if rl := ds.RateLimit; rl != nil {
			l, err := newDLimit(p, *rl)
			if err != nil {
				return err
			}
			n.limit = l
			c.rules = append(c.rules, l.rule)
		}
		if err := c.addNodes(n, p, ds.Descriptors); err != nil {
			return err
		}
		if parent.children == nil {
			parent.children = map[string]*dnode{}
		}
		parent.children[id] = n
	}
	return nil
}

// Domains returns the names of a drop-in configuration's domains, sorted;
// none for a tokengate configuration.
func (c *Config) Domains() []string {
	if c.dropin == nil {
		return nil
	}
	names := make([]string, 0, len(c.dropin.domains))
	for n := range c.dropin.domains {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// newDLimit checks rl (at path) and returns it ready for deciding.
func newDLimit(path string, rl RateLimit) (*dlimit, error) {
	secs := UnitSeconds(rl.Unit)
	switch {
	case rl.Unlimited && secs != 0:
		return nil, errors.New(path + ": rate_limit: unlimited must not have a unit")
	case !rl.Unlimited && secs == 0:
		return nil, errors.New(path + ": rate_limit: unit " + strconv.Quote(rl.Unit.String()) + " is not one of second, minute, hour, day, week, month, year")
	}
	for _, r := range rl.Replaces {
		if r == "" {
			return nil, errors.New(path + ": rate_limit.replaces: an empty name")
		}
		if r == rl.Name {
			return nil, errors.New(path + ": rate_limit.replaces: the limit's own name " + strconv.Quote(r))
		}
	}
	l := &dlimit{RateLimit: rl, window: secs}
	l.rule = limitRule(path, rl.RequestsPerUnit, secs, rl.Shadow)
	return l, nil
}

// limitRule is the token bucket of N per secs seconds: burst N, refilled
// at N/secs per second. N = 0 (nothing ever passes) has no valid bucket;
// its rule has a zero Limit and is decided without Redis.
func limitRule(name string, n uint32, secs int64, shadow bool) *config.Rule {
	r := &config.Rule{Name: name, Shadow: shadow, Cluster: true}
	if n > 0 && secs > 0 {
		r.Limit = bucket.Limit{Rate: float64(n) / float64(secs), Burst: float64(n)}
	}
	return r
}

// resolve returns the limit of a descriptor of domain (envoyproxy/
// ratelimit's GetLimit): nil when the domain is unknown or no limit
// applies. Like that project it matches composite keys, not keys and
// values apart: at each level an entry's "key_value" is looked up among
// the nodes' composite keys, else matched against the patterns (composite
// keys holding '*', first in file order), else the entry's key alone is
// looked up. So an entry {a, b_c} reaches the node {key: a_b, value: c},
// an entry {a_b, c} the node {key: a, value: b}, and the pattern
// {key: a, value: b*} matches the entry {a_b, x}
// (docs/dropin.md#matching). The limit is the one of the node the last
// entry matched.
//
// keyed are the entries the limit counts under: entries itself, except
// that an entry a share_threshold node matched as a pattern has that
// pattern for value, as envoyproxy/ratelimit keys it (its
// ShareThresholdKeyPattern): the node's composite key without the
// entry's "key_" in front. Every value the pattern matches then counts in
// one window, or one bucket.
func (d *dropin) resolve(domain string, entries []Entry) (l *dlimit, keyed []Entry) {
	n := d.domains[domain]
	if n == nil {
		return nil, nil
	}
	var buf []byte
	keyed = entries
	copied := false
	for i, e := range entries {
		buf = append(append(append(buf[:0], e.Key...), '_'), e.Value...)
		next, byPattern := n.match(buf, e.Key)
		if next == nil {
			return nil, nil
		}
		if byPattern && next.share {
			if !copied {
				keyed, copied = append([]Entry(nil), entries...), true
			}
			keyed[i].Value = strings.TrimPrefix(next.wildKey, e.Key+"_")
		}
		if i == len(entries)-1 {
			return next.limit, keyed
		}
		if len(next.children) == 0 {
			return nil, nil // the descriptor is deeper than the tree
		}
		n = next
	}
	return nil, nil
}

// match returns the child an entry reaches, and whether it reached it as
// a pattern: composite is the entry's "key_value", key its key.
func (n *dnode) match(composite []byte, key string) (*dnode, bool) {
	if c := n.children[string(composite)]; c != nil {
		return c, false
	}
	if len(n.wild) > 0 {
		s := string(composite)
		for _, c := range n.wild {
			if wildMatch(c.wildParts, s) {
				return c, true
			}
		}
	}
	return n.children[key], false
}

// wildMatch reports whether v matches the pattern split at '*' into parts:
// it starts with the first, ends with the last, and holds the others in
// order between them.
func wildMatch(parts []string, v string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	v = v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(v, p)
		if i < 0 {
			return false
		}
		v = v[i+len(p):]
	}
	return true
}

// sharedDetailedName is detailedName for a descriptor that a
// share_threshold pattern matched (keyed differs from entries), as
// envoyproxy/ratelimit names its detailed stat then: the domain, then per
// entry ".key_<pattern>" where a pattern keys it, else ".key_value", or
// ".key" for an empty value; cut to maxDetailedLabel bytes as detailedName
// cuts.
func sharedDetailedName(domain string, entries, keyed []Entry) string {
	b := []byte(domain)
	for i, e := range entries {
		b = append(append(b, '.'), e.Key...)
		if v := keyed[i].Value; v != "" { // a pattern is never empty
			b = append(append(b, '_'), v...)
		}
		if len(b) > maxDetailedLabel {
			break
		}
	}
	if len(b) > maxDetailedLabel {
		cut := maxDetailedLabel
		for cut > 0 && !utf8.RuneStart(b[cut]) { // at a character boundary
			cut--
		}
		b = b[:cut]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// overrideLimit is the limit of a descriptor that carries Envoy's limit
// override (RateLimitDescriptor.limit): N per unit, no name, never shadow.
// Its token bucket is keyed by N and the unit, so that it never shares a
// bucket with another limit.
func overrideLimit(domain string, n uint32, unit Unit) (*dlimit, error) {
	secs := UnitSeconds(unit)
	if secs == 0 {
		return nil, errors.New("descriptor limit: unit " + strconv.Quote(unit.String()) + " is not one of SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR")
	}
	l := &dlimit{RateLimit: RateLimit{RequestsPerUnit: n, Unit: unit}, window: secs}
	l.rule = limitRule(domain+".override", n, secs, false)
	return l, nil
}

// windowKey is envoyproxy/ratelimit's counter key for a descriptor in the
// window that starts at start: prefix, domain, then each entry's key and
// value, each followed by '_', then start in Unix seconds.
func windowKey(prefix, domain string, entries []Entry, start int64) string {
	var b strings.Builder
	n := len(prefix) + len(domain) + 24
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	b.Grow(n)
	b.WriteString(prefix)
	b.WriteString(domain)
	b.WriteByte('_')
	for _, e := range entries {
		b.WriteString(e.Key)
		b.WriteByte('_')
		b.WriteString(e.Value)
		b.WriteByte('_')
	}
	b.WriteString(strconv.FormatInt(start, 10))
	return b.String()
}

// dropinBucketKey is the Redis key of a drop-in token bucket: the domain,
// the limit (N per unit) and every entry's key and value, percent-encoded
// as sharedstate's composite keys are, inside redisstore.BucketKey's hash tag.
func dropinBucketKey(domain string, l *dlimit, entries []Entry) string {
	vals := make([]string, 0, 2+2*len(entries))
	vals = append(vals, domain, strconv.FormatUint(uint64(l.RequestsPerUnit), 10)+"/"+strconv.FormatInt(l.window, 10))
	for _, e := range entries {
		vals = append(vals, e.Key, e.Value)
	}
	return redisstore.BucketKey("rl", string(sharedstate.AppendComposite(nil, vals)))
}

// remainingOf is a bucket's whole tokens as a status's limit_remaining.
func remainingOf(tokens float64) uint32 {
	if !(tokens > 0) {
		return 0
	}
	return uint32(min(math.Floor(tokens), math.MaxUint32))
}
