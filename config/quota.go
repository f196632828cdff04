package config

import (
	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// Quota is a calendar quota's limit ("algorithm": "quota"): at most Limit
// units per period of the calendar, counted by the rate-limit service for
// the whole fleet (scope "cluster" only, never "mode": "lease"). The
// filter only forwards it; tokengate-rls computes the periods in TimeZone
// and refuses a zone its database does not know.
//
// Example (a million tokens a month from each customer's billing day, in
// Paris time, with warnings at 80 % and 95 %):
//
//	{"name": "monthly", "limit_keys": ["header:x-api-key"], "scope": "cluster",
//	 "algorithm": "quota", "algorithm_config": {"limit": 1000000, "period": "month",
//	 "time_zone": "Europe/Paris", "billing_day": 15, "thresholds": [0.8, 0.95],
//	 "cost_source": "response_json:/usage/total_tokens"}}
type Quota struct {
	_ incomparable
	// Limit is the units one key may take per period ("limit").
	Limit float64
	// Period is QuotaHour, QuotaDay, QuotaWeek (ISO, from Monday 00:00)
	// or QuotaMonth ("period").
	Period int
	// TimeZone is the IANA zone the periods start in ("time_zone",
	// default "UTC").
	TimeZone string
	// BillingDay is the day of the month a QuotaMonth period starts on at
	// 00:00 ("billing_day", 1 to 31; a month with fewer days starts on its
	// last day); 0 for the first.
	BillingDay int
	// Thresholds are the shares of the limit, ascending in (0, 1), whose
	// first crossing in a period is reported ("thresholds", at most 4).
	Thresholds []float64
	// LimitSource is where a request carries its identity's own limit
	// ("limit_source": a header or a verified JWT claim); nil for none.
	LimitSource *Descriptor
	// MaxLimit bounds the identity's limit ("max_limit"): the service uses
	// min(identity's value, MaxLimit). Set exactly when LimitSource is.
	MaxLimit float64
}

// Quota periods (Quota.Period).
const (
	QuotaHour = iota
	QuotaDay
	QuotaWeek
	QuotaMonth
)

// QuotaPeriodNames are the "period" values, indexed by Quota.Period.
var QuotaPeriodNames = [...]string{"hour", "day", "week", "month"}

// QuotaNominalSeconds are the nominal lengths of the periods, indexed by
// Quota.Period: a Gregorian month is 2629746 s on average. A quota rule's
// Limit.Rate is Quota.Limit over it.
var QuotaNominalSeconds = [...]float64{3600, 86400, 604800, 2629746}

// maxThresholds bounds a quota's thresholds; maxZoneLen its time_zone.
const (
	maxThresholds = 4
	maxZoneLen    = 64
)

// quotaFields are the fields of a quota's algorithm_config (a variable:
// a list built at the call would cost code).
var quotaFields = []string{"limit", "period", "time_zone", "billing_day", "thresholds", "limit_source", "max_limit",
	"cost_source", "fixed_cost", "default_cost", "count_statuses", "reset_on_statuses", "pre_charge", "estimate_source", "strip_accept_encoding"}

// quotaConfig reads a quota rule's algorithm_config: here what the filter
// uses (the limit, the period, the identity's limit, the cost), and in
// quotaDetails what only the service does. It is written with few calls
// and one error exit: each call site costs the wasm module tens of bytes.
func quotaConfig(path string, v ljson.Result, r *Rule) error {
	if err := object(path, v, quotaFields...); err != nil {
		return err
	}
	q := &Quota{TimeZone: "UTC"}
	var n [2]float64
	var err error
	msg := ""
	p, ls, f := v.Get("period"), v.Get("limit_source"), [2]ljson.Result{v.Get("limit"), v.Get("max_limit")}
	for i := 0; i < 2 && err == nil; i++ {
		if f[i].Exists() {
			n[i], err = positive(path+"."+quotaFields[i*6], f[i], maxBurst)
		}
	}
	if err == nil {
		q.Period, err = choice(path+".period", p, QuotaPeriodNames[:]...)
	}
	d, e := ParseDescriptor(ls.Str)
	at := "limit"
	switch {
	case err != nil:
		return err
	case n[0] == 0:
		msg = "is required"
	case !p.Exists():
		at, msg = "period", "is required"
	case ls.Exists() && (e != nil || ls.Type != ljson.String || d.Kind != DescHeader && d.Kind != DescJWT):
		at, msg = "limit_source", `must be "header:<name>" or "jwt:<claim>", got `+short(ls.Raw)
	case ls.Exists() != (n[1] > 0):
		at, msg = "max_limit", "is required with limit_source, and only with it: it bounds the limit a request carries"
	}
	if msg != "" {
		return errAt(path+"."+at, msg)
	}
	if ls.Exists() {
		q.LimitSource = &d
	}
	if err := quotaDetails(path, v, q); err != nil {
		return err
	}
	q.Limit, q.MaxLimit = n[0], n[1]
	r.Quota = q
	r.Limit = bucket.Limit{Rate: q.Limit / QuotaNominalSeconds[q.Period], Burst: q.Limit}
	return costConfig(path, v, r)
}

// quotaScope refuses a quota rule that is not decided exactly by the
// rate-limit service: a quota's consumption is counted where it is
// stored, in the service's Redis, and a lease hands a proxy tokens that
// refill over time, which a period's count has no notion of.
func quotaScope(path string, r *Rule) error {
	if r.Quota == nil || r.Cluster && r.Lease == nil {
		return nil
	}
	at, msg := "scope", `"algorithm": "quota" needs "scope": "cluster": a period's consumption is counted by the rate-limit service for the whole fleet`
	if r.Cluster {
		at, msg = "mode", `"algorithm": "quota" cannot be "lease": a lease hands a proxy tokens that refill over time, `+
			`while a period's consumption must be counted where it is stored; use "mode": "exact" (docs/configuration.md)`
	}
	return errAt(join(path, at), msg)
}
