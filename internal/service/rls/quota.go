package rls

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/ratelimitheader"
	"github.com/tokengate/tokengate/rlscontract"
)

// Calendar quotas ("algorithm": "quota", docs/rls.md#quotas): the service
// computes the period of the rule's zone that holds its clock's now
// (Period), and internal/service/redisstore/quota.lua admits the request's units if the period's
// consumption plus them stays within the limit that applies, in the same
// pipeline as the request's token buckets. The limit is, first, the key's
// override in Redis ("ov:{...}", set by the admin API), then the
// identity's (the descriptor's rlscontract.LimitKey entry, bounded by
// max_limit), then the rule's.

// quotaRule is what the service computes once per configuration for one
// quota rule.
type quotaRule struct {
	loc *time.Location
	// args are the script's limit and thresholds arguments
	// (redisstore.QuotaOp.Args), formatted once.
	args []string
	// percents are the thresholds as the warning header and the metric
	// name them ("80", "95", "99.5").
	percents []string
}

// WarningHeader is the response header of an OK answer whose request
// crossed one of a quota rule's thresholds first in its period:
// "<rule>";t=<percent>, the highest crossed.
const WarningHeader = "tokengate-quota-warning"

// QuotaSource says which limit applied to a quota decision.
type QuotaSource int

// Where a quota's limit comes from, by precedence.
const (
	SourceRule     QuotaSource = iota // the rule's limit
	SourceIdentity                    // the identity's, min(value, max_limit)
	SourceOverride                    // the key's override (admin API)
)

// String returns "rule", "identity" or "override".
func (s QuotaSource) String() string {
	return [...]string{"rule", "identity", "override"}[s]
}

// loadQuota checks r's time zone against the zone database and returns
// its quotaRule. "Local" (the machine's zone) is refused: a fleet's
// replicas would disagree.
func loadQuota(r *config.Rule) (*quotaRule, error) {
	z := r.Quota.TimeZone
	loc, err := time.LoadLocation(z)
	if err != nil || z == "Local" {
		return nil, &config.ConfigError{Msg: "rule " + strconv.Quote(r.Name) + ": algorithm_config.time_zone: unknown time zone " +
			strconv.Quote(z) + ", want an IANA name such as \"Europe/Paris\" or \"UTC\""}
	}
	q := &quotaRule{loc: loc, args: []string{redisstore.Num(r.Quota.Limit)}}
	for _, t := range r.Quota.Thresholds {
		q.percents = append(q.percents, strconv.FormatFloat(t*100, 'f', -1, 64))
		q.args = append(q.args, redisstore.Num(t))
	}
	return q, nil
}

// IdentityLimit returns the limit a quota rule applies for an identity
// that carries value (rlscontract.LimitKey): min(value, max_limit), and
// whether it applies; a value that is not a number > 0, or a rule without
// limit_source, leaves the rule's limit.
func IdentityLimit(q *config.Quota, value string) (float64, bool) {
	if q.LimitSource == nil || value == "" || len(value) > 32 {
		return q.Limit, false
	}
	v, err := strconv.ParseFloat(value, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 1) {
		return q.Limit, false
	}
	return min(v, q.MaxLimit), true
}

// quotaItem makes it, an item of quota rule r whose token-bucket key the
// descriptor resolved to ("tb:{<rule>:<composite>}"), a quota decision
// for the period holding now.
func (c *Config) quotaItem(it *item, key string, entries []Entry, now time.Time) {
	r := it.rule
	qr := c.quotas[r]
	start, end := Period(r.Quota, qr.loc, now)
	limit, identity := r.Quota.Limit, false
	if _, _, v, ok := rlscontract.ParseCluster(entries); ok && v != "" {
		limit, identity = IdentityLimit(r.Quota, v)
	}
	qkey := redisstore.QuotaKeyOf(key, start.Unix())
	// The state and the op in one allocation.
	st := &quotaState{rule: qr, end: end, now: now, identity: identity}
	st.op = redisstore.QuotaOp{Override: redisstore.OverrideOf(key), Limit: limit, TTL: redisstore.QuotaTTL(qkey, int64(math.Ceil(end.Sub(now).Seconds()))),
		Thresholds: r.Quota.Thresholds}
	if !identity {
		st.op.Args = qr.args
	}
	it.op = redisstore.Op{Key: qkey, Cost: it.op.Cost, Quota: &st.op}
	it.quota = st
}

// quotaState is a quota item's period and where its limit came from, and
// its op's quota part.
type quotaState struct {
	rule     *quotaRule
	end, now time.Time
	identity bool
	op       redisstore.QuotaOp
}

// source returns which limit the decision applied.
func (q *quotaState) source(out *redisstore.QuotaResult) QuotaSource {
	switch {
	case out.Override:
		return SourceOverride
	case q.identity:
		return SourceIdentity
	}
	return SourceRule
}

// quotaPlan returns the RateLimit header plan of quota rule r under the
// limit that applied: the configuration's own when it is the rule's.
func (c *Config) quotaPlan(r *config.Rule, limit float64) *ratelimitheader.Plan {
	if limit == r.Quota.Limit {
		return c.planOf(r)
	}
	p := ratelimitheader.NewPlan(r.Name, bucket.Limit{Rate: limit / config.QuotaNominalSeconds[r.Quota.Period], Burst: limit})
	return &p
}

// warning returns the Tokengate-Quota-Warning value for a request that
// crossed the thresholds of r in crossed (a bitmask) first: the highest.
func (q *quotaRule) warning(r *config.Rule, crossed uint8) string {
	hi := -1
	for i := range q.percents {
		if crossed&(1<<i) != 0 {
			hi = i
		}
	}
	if hi < 0 {
		return ""
	}
	return strconv.Quote(r.Name) + ";t=" + q.percents[hi]
}

// quotaStatus fills the status of a quota item from internal/service/redisstore/quota.lua's answer,
// counts the decision and the thresholds it crossed first, and returns
// what the RateLimit headers say of it (ok is false for a shadow rule).
// remaining is the limit less the consumption (at least 0); the reset, and
// an OVER_LIMIT's duration_until_reset, the seconds to the period's end.
func (s *Server) quotaStatus(cfg *Config, it *item, st *rlsv3.RateLimitResponse_DescriptorStatus, p *statusParts) (quota, bool) {
	q, out := it.quota, it.out.Quota
	r := it.rule
	left := max(out.Limit-out.Used, 0)
	untilEnd := q.end.Sub(q.now).Seconds()
	p.limit = rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: uint32(min(math.Floor(out.Limit), math.MaxUint32)),
		Unit: periodUnits[r.Quota.Period]}
	st.CurrentLimit = &p.limit
	st.LimitRemaining = remaining(left)
	setDuration(&p.untilReset, untilEnd)
	st.DurationUntilReset = &p.untilReset
	it.full, it.retry = untilEnd, 0
	code := codeOK
	if !it.out.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		it.retry = untilEnd
		if it.op.Cost > out.Limit {
			it.retry = math.Inf(1) // never passes, whatever the period
		}
		code = codeOver
		if r.Shadow {
			code = codeShadowOver
		}
	}
	s.metrics.decision(r, code, it.op.Cost)
	if it.out.Allowed && out.Limit > 0 {
		s.metrics.quotaUsed(r, out.Used/out.Limit)
	}
	if r.Shadow {
		return quota{}, false
	}
	return quota{rule: r, plan: cfg.quotaPlan(r, out.Limit), remaining: int64(st.LimitRemaining), reset: ratelimitheader.Seconds(untilEnd),
		allowed: it.out.Allowed, retry: it.retry, tokens: left}, true
}

// quotaWarnings appends to hs, for an OK answer, the warning header of
// every quota rule whose thresholds the request crossed first in its
// period, and counts each threshold crossed once.
func (s *Server) quotaWarnings(items []item, hs []*corev3.HeaderValue) []*corev3.HeaderValue {
	for i := range items {
		it := &items[i]
		if it.quota == nil || it.out.Quota == nil || !it.out.Allowed || it.out.Quota.Crossed == 0 {
			continue
		}
		for j, pct := range it.quota.rule.percents {
			if it.out.Quota.Crossed&(1<<j) != 0 {
				s.metrics.quotaCrossed(it.rule, pct)
			}
		}
		if it.rule.Shadow {
			continue
		}
		hs = append(hs, &corev3.HeaderValue{Key: WarningHeader, Value: it.quota.rule.warning(it.rule, it.out.Quota.Crossed)})
	}
	return hs
}

// ErrNotQuota is Usage's error for a rule name that is not a quota rule
// of the configuration in force.
var ErrNotQuota = errors.New("no quota rule of that name")

// Usage is one key's consumption of a quota rule in the period that holds
// the service's clock: what a usage endpoint answers.
type Usage struct {
	Rule, Key string
	// Period is the rule's "hour", "day", "week" or "month".
	Period string
	// Used is the units consumed in the period; Limit the limit that
	// applies to a request without an identity limit (the override's, or
	// the rule's: Source); Remaining is Limit - Used, at least 0.
	Used, Limit, Remaining float64
	// PeriodStart and Reset are the period's start and end.
	PeriodStart, Reset time.Time
	Source             QuotaSource
}

// Usage reads, without changing it, the consumption of quota rule rule
// by the composite key (the filter's, sharedstate.AppendComposite of the
// rule's limit-key values) in the current period, and its override, in
// one script call (internal/service/redisstore/quota.lua's "read" mode).
// ErrNotQuota names an unknown rule; a Redis failure is returned as is.
func (s *Server) Usage(ctx context.Context, rule, composite string) (Usage, error) {
	cfg := s.cfg.Load()
	r := cfg.cluster[rule]
	if r == nil || r.Quota == nil {
		return Usage{}, ErrNotQuota
	}
	now := s.clock()
	it := item{rule: r}
	cfg.quotaItem(&it, redisstore.BucketKey(r.Name, cleanComposite(composite)), nil, now)
	it.quota.op.Mode = redisstore.QuotaRead
	out := s.store.Run(ctx, []redisstore.Op{it.op})[0]
	if out.Err != nil {
		return Usage{}, out.Err
	}
	start, end := Period(r.Quota, cfg.quotas[r].loc, now)
	q := out.Quota
	return Usage{Rule: rule, Key: composite, Period: config.QuotaPeriodNames[r.Quota.Period], Used: q.Used, Limit: q.Limit,
		Remaining: max(q.Limit-q.Used, 0), PeriodStart: start, Reset: end, Source: it.quota.source(q)}, nil
}
