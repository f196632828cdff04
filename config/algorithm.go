package config

import (
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

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
	if err := object(path, v, "limit", "window_seconds", "capacity", "window_start", "cost_source", "fixed_cost", "default_cost", "count_statuses", "reset_on_statuses"); err != nil {
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
		// Each window adds limit tokens up to capacity: below the limit,
		// the limit the headers state (q) could never pass in a window.
		if capacity < limit {
			return errAt(path+".capacity", "must be >= limit ("+num(limit)+"), the tokens each window adds: capacity is what "+
				"unused tokens may roll over up to, and below the limit a window would admit only capacity, got "+num(capacity))
		}
	}
	if r.WindowStart, err = choice(path+".window_start", v.Get("window_start"), "aligned", "hash", "random"); err != nil {
		return err
	}
	r.Limit = bucket.Limit{Rate: limit, Burst: capacity, Window: window}
	return costConfig(path, v, r)
}

func algorithmConfig(path string, v ljson.Result, r *Rule) error {
	if err := object(path, v, append([]string{"tokens_per_second", "rps", "burst", "cost_source", "fixed_cost", "default_cost",
		"count_statuses", "reset_on_statuses", "pre_charge", "max_debt", "estimate_source", "strip_accept_encoding"}, delayFields...)...); err != nil {
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
	if err := costConfig(path, v, r); err != nil {
		return err
	}
	return shapingReserves(path, r, rateField)
}

// shapingReserves refuses a rule whose burst is below its rate (allowed
// only because it reserves) when its effective reservation cannot hold one
// request: max_reserved capped by max_delay_ms × rate. Such a rule is the
// same as one without max_reserved, which the burst check refuses.
func shapingReserves(path string, r *Rule, rateField string) error {
	d, rate := r.Delay, r.Limit.Rate
	if r.Limit.Burst >= rate || d.MaxReserved == 0 {
		return nil
	}
	cost := r.Cost.Fixed
	if r.Cost.Kind != CostFixed {
		cost = r.Cost.Default
	}
	if d.Debt >= cost {
		return nil
	}
	why := "with burst (" + num(r.Limit.Burst) + ") below " + rateField + " (" + num(rate) + ") the rule must reserve at least the cost of one request (" + num(cost) + ")"
	if d.Debt < d.MaxReserved {
		return errAt(path+".max_delay_ms", "caps the reservation at "+num(d.Debt)+" tokens (max_delay_ms / 1000 × "+rateField+"); "+
			why+", so max_delay_ms must be >= "+num(cost/rate*1000)+", got "+num(d.MaxDelayMs))
	}
	return errAt(path+".max_reserved", why+", got "+num(d.MaxReserved))
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
		// A fixed window's capacity, which is its limit unless set: blame
		// the field the file sets.
		cap = "capacity"
		if !v.Get("capacity").Exists() {
			cap = "limit"
		}
	}
	if r.Quota != nil {
		cap = "limit"
	}
	if r.Cost.Kind == CostFixed && r.Cost.Fixed > burst {
		if !v.Get("fixed_cost").Exists() {
			return errAt(path+"."+cap, "must be >= the cost of a request (1, the default fixed_cost)"+never+", got "+num(burst))
		}
		return errAt(path+".fixed_cost", "must be <= "+cap+" ("+num(burst)+")"+never+", got "+num(r.Cost.Fixed))
	}
	// A cost the response reports is charged after the response, into
	// debt when it is more than the balance: a default_cost above the
	// burst delays later requests but never stops this one.
	if r.Cost.Default > burst && r.Cost.Kind != CostResponse && (r.Cost.Kind != CostFixed || v.Get("default_cost").Exists()) {
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
		return CostHeader, lite.ToLowerASCII(name), true
	case "query":
		return CostQuery, name, true
	}
	return 0, "", false
}
