// Package config is tokengate's configuration as data: the JSON parser
// (Parse) and the parsed types, pure values that the filter
// (proxy_on_configure), the rate-limit service (internal/service/rls) and
// tokengate-local build their own runtime state from. Nothing in a parsed Config changes after Parse, so one
// Config may be shared by goroutines.
//
// The package runs inside the wasm guest: it uses strconv, never fmt, log
// or os.
package config

import (
	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/sharedstate"
)

// Config is a parsed, validated plugin configuration. It is built once by
// Parse and then only read: by every stream of a plugin, by every request
// of the service.
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

// Rules returns every rule of every policy, fallback limits included, in
// configuration order: each policy's rules, then its fallback. The slice is
// the Config's own; callers must not modify it.
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
	// IPv6Prefix is the prefix length, in bits, by which ip:address keys
	// an IPv6 client ("ipv6_prefix", default 64, 1 to 128): the value is
	// the client's network, "2001:db8:1:2::/64", so that one host cannot
	// take a bucket per address of the /64 it is given. 128 keys every
	// address on its own (written without "/128"). IPv4 clients are keyed
	// by their address.
	IPv6Prefix int
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
	// OnMissingKey is what a request whose limit key cannot be built (an
	// absent header, query parameter or claim, a token that does not
	// decode) does ("on_missing_key"): MissingKeySkip, MissingKeyShared or
	// MissingKeyDeny.
	OnMissingKey int
	// MaxKeys bounds the shared-data keys the rule may create ("max_keys",
	// default Settings.MaxKeysPerRule): its buckets live in MaxKeys slots,
	// see sharedstate's "Bounded key space". 0 means one key per identity,
	// without bound. A rule without limit keys always has one key.
	MaxKeys int
	// WindowStart is a fixed window's start mode ("window_start":
	// WindowAligned, WindowHash or WindowRandom).
	WindowStart int
	// Delay is a token bucket's delayed admission ("max_reserved" and its
	// companions); its zero MaxReserved means none.
	Delay Delay
	// Shadow reports whether the rule only observes: it belongs to a
	// policy in shadow mode, or is an rls_descriptors rule with "shadow":
	// true. Its buckets live under the "shadow:" key prefix; it never
	// rejects and adds no headers.
	Shadow bool

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
	// Quota makes the rule a calendar quota ("algorithm": "quota", scope
	// "cluster"); nil for other algorithms. Limit is then {Rate: the
	// quota's limit over its period's nominal seconds, Burst: the limit},
	// so that checks of a cost against the burst hold.
	Quota *Quota
}

// Rule.OnMissingKey values.
const (
	// MissingKeySkip ("skip", the default): the rule does not apply to
	// the request, which a policy's fallback_limit may then limit.
	MissingKeySkip = iota
	// MissingKeyShared ("shared"): every such request takes from one
	// bucket, the one of an empty value in place of each missing one.
	MissingKeyShared
	// MissingKeyDeny ("deny"): the request is rejected (reason
	// "missing_key", settings.rejection_status) before any bucket is
	// charged.
	MissingKeyDeny
)

// MatchCond is one entry of a rule's "match" object.
type MatchCond struct {
	_          incomparable
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
	// admission reserves SettleSpec.PreCharge, or the request's estimate
	// (Estimate).
	CostResponse
	// CostRequestJSON is an estimate read from the request's JSON body
	// (CostSource.Estimate "request_json:<pointers>",
	// SettleSpec.EstimatePointers):
	// the filter reserves pre_charge when the headers arrive and the rest
	// of the estimate when the body has.
	CostRequestJSON
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
	// the cost when the response reports none, if it is more than the
	// request reserved.
	Default float64
	// PreCharge is what CostResponse reserves at admission
	// (SettleSpec.PreCharge).
	PreCharge float64
	// Estimate and EstimateName, for CostResponse, are where the request
	// states its own estimate ("estimate_source": CostHeader, CostQuery
	// or CostRequestJSON; CostFixed for none). A valid estimate above
	// PreCharge is reserved instead, at most Burst.
	Estimate     CostKind
	EstimateName string
	// Burst caps an estimate (the rule's burst).
	Burst float64
}

const (
	defaultMaxAttempts = sharedstate.DefaultMaxAttempts
	maxMaxAttempts     = 1000
	// MaxXFFHops bounds settings.xff_trusted_hops.
	MaxXFFHops = 10
	// DefaultIPv6Prefix is the default of Settings.IPv6Prefix: a /64 is
	// what one host or one subscriber is usually given.
	DefaultIPv6Prefix = 64
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
	_    incomparable
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

// incomparable is a zero-width field that makes a struct not comparable
// (as net/http's): the compiler then generates no equality function for
// it, which the wasm module would carry (a few hundred bytes each, with its
// function table entries) though nothing compares the struct. Put it first:
// last, a zero-width field adds padding.
type incomparable [0]func()
