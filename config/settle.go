package config

import (
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// SettleSpec is what a rule settles after the response: the statuses it
// counts, the statuses that reset its bucket, and a cost the response
// reports. Parse sets Rule.Settle only for rules that use one of them; the
// filter's settle.go says what happens at run time.
type SettleSpec struct {
	// Count lists the statuses whose requests keep their cost
	// ("count_statuses"); the cost of any other final status is refunded.
	// Without it every status counts.
	Count    StatusSet
	HasCount bool
	// Reset lists the statuses that fill the key's bucket
	// ("reset_on_statuses").
	Reset    StatusSet
	HasReset bool

	// Response is where the cost known after the response comes from
	// (cost_source response_header, response_json or response_sse);
	// ResponseNone when the cost is known at admission.
	Response ResponseSource
	// Header is the response header of ResponseHeader (lower case).
	Header string
	// Pointers are the JSON pointers of ResponseJSON and ResponseSSE; the
	// cost is the sum of their numbers.
	Pointers []ljson.Pointer
	// PreCharge is what admission reserves ("pre_charge", default
	// Burst/DefaultReserveShare); the difference with the reported cost is
	// settled when the stream ends. A request that states a larger
	// estimate (CostSource.Estimate) reserves that instead.
	PreCharge float64
	// EstimatePointers are the JSON pointers of an estimate read from the
	// request body (CostSource.Estimate CostRequestJSON,
	// "request_json:<pointers>"); the estimate is the sum of the numbers
	// found at them.
	EstimatePointers []ljson.Pointer
	// StripAcceptEncoding reports whether the request's Accept-Encoding is
	// replaced by "identity" ("strip_accept_encoding", response_json and
	// response_sse only), so that the upstream answers a body the filter
	// can read.
	StripAcceptEncoding bool
}

// DefaultReserveShare sets the default pre_charge of a response-cost rule:
// burst / DefaultReserveShare, so that at most that many requests of one
// key are in flight on a full bucket before any has reported its usage.
const DefaultReserveShare = 10

// ResponseSource is where a cost known after the response comes from.
type ResponseSource int

// Response cost sources.
const (
	ResponseNone   ResponseSource = iota
	ResponseHeader                // a number in a response header
	ResponseJSON                  // the number at a JSON pointer in the body
	ResponseSSE                   // the last number at a JSON pointer in server-sent events
)

// StatusSet is a set of HTTP statuses from 100 to 599.
type StatusSet [10]uint64

// Has reports whether status is in the set.
func (s *StatusSet) Has(status int) bool {
	return status >= 0 && status < 640 && s[status/64]&(1<<(status%64)) != 0
}

func (s *StatusSet) add(status int) { s[status/64] |= 1 << (status % 64) }

func (s *StatusSet) overlaps(o *StatusSet) bool {
	for i := range s {
		if s[i]&o[i] != 0 {
			return true
		}
	}
	return false
}

// maxPointers bounds the JSON pointers of one response cost.
const maxPointers = 4

// maxLeaseSeconds bounds lease_seconds (a day).
const maxLeaseSeconds = 86400

// maxInFlight bounds max_in_flight.
const maxInFlight = 1000000

// defaultLeaseSeconds is the default lease_seconds.
const defaultLeaseSeconds = 600

// statusSet parses count_statuses or reset_on_statuses: a status (401 or
// "401"), a class ("4xx"), or an array of them.
func statusSet(path string, v ljson.Result) (StatusSet, error) {
	var set StatusSet
	items := []ljson.Result{v}
	if v.IsArray() {
		items = v.Array()
		if len(items) == 0 {
			return set, errAt(path, "must not be empty")
		}
	}
	for i, e := range items {
		epath := path
		if v.IsArray() {
			epath = path + "[" + strconv.Itoa(i) + "]"
		}
		switch {
		case e.Type == ljson.Number:
			n, ok := integer(e)
			if !ok || n < 100 || n > 599 {
				return set, errAt(epath, "must be a status from 100 to 599, got "+short(e.Raw))
			}
			set.add(int(n))
		case e.Type == ljson.String && len(e.Str) == 3 && e.Str[0] >= '1' && e.Str[0] <= '5' && isDigits(e.Str[1:]):
			n, _ := strconv.Atoi(e.Str)
			set.add(n)
		case e.Type == ljson.String && len(e.Str) == 3 && e.Str[0] >= '1' && e.Str[0] <= '5' && lite.EqualFoldASCII(e.Str[1:], "xx"):
			base := int(e.Str[0]-'0') * 100
			for s := base; s < base+100; s++ {
				set.add(s)
			}
		default:
			return set, errAt(epath, `must be a status (401 or "401") or a class ("4xx"), got `+short(e.Raw))
		}
	}
	return set, nil
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// responseCost parses a cost_source of the response_* kinds into r, and
// reports whether s is one.
func responseCost(path string, s string, r *Rule) (bool, error) {
	kind, arg, _ := strings.Cut(s, ":")
	var src ResponseSource
	switch kind {
	case "response_header":
		src = ResponseHeader
	case "response_json":
		src = ResponseJSON
	case "response_sse":
		src = ResponseSSE
	default:
		return false, nil
	}
	spec := r.settleSpec()
	spec.Response = src
	if src == ResponseHeader {
		if !validName(arg) {
			return true, errAt(path, "response_header needs a header name of 1 to 64 characters from [A-Za-z0-9_-], got "+strconv.Quote(clip(arg)))
		}
		spec.Header = lite.ToLowerASCII(arg)
		return true, nil
	}
	ps, err := pointers(path, kind, arg)
	spec.Pointers = ps
	return true, err
}

// pointers parses arg, up to maxPointers JSON pointers joined by '+', of a
// source named kind (response_json, response_sse, request_json).
func pointers(path, kind, arg string) ([]ljson.Pointer, error) {
	parts := strings.Split(arg, "+")
	if len(parts) > maxPointers {
		return nil, errAt(path, "at most "+strconv.Itoa(maxPointers)+" JSON pointers joined by '+', got "+strconv.Itoa(len(parts)))
	}
	ps := make([]ljson.Pointer, 0, len(parts))
	for i, part := range parts {
		p, ok := ljson.ParsePointer(part)
		if !ok {
			got := strconv.Quote(clip(part))
			if part == "" {
				got = "an empty pointer"
			}
			if len(parts) > 1 {
				got += " (pointer " + strconv.Itoa(i+1) + " of " + strconv.Quote(clip(arg)) + ")"
			}
			return nil, errAt(path, kind+" needs JSON pointers such as \"/usage/total_tokens\" (1 to "+
				strconv.Itoa(ljson.MaxPointerTokens)+" tokens of at most "+strconv.Itoa(ljson.MaxPointerToken)+
				" bytes, joined by '+'), got "+got)
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// settleSpec returns r.Settle, creating it.
func (r *Rule) settleSpec() *SettleSpec {
	if r.Settle == nil {
		r.Settle = &SettleSpec{}
	}
	return r.Settle
}

// maxDebtRemoved is why an algorithm_config's max_debt is refused: it set
// a floor below which a reported cost was forgiven, and a cost is now
// always carried in full (docs/configuration.md, "Reserving at
// admission").
const maxDebtRemoved = "is no longer accepted: a reported cost is always carried in full and the debt is repaid by the refill, " +
	"never forgiven (a bucket in debt already refuses new requests); remove it, and to bound what one request may take, " +
	"reserve its estimate at admission (estimate_source, pre_charge) and cap the upstream's usage (max_tokens)"

// settleConfig reads the settlement fields of an algorithm_config (the
// cost_source has been read): count_statuses, reset_on_statuses,
// pre_charge and estimate_source; max_debt is refused (maxDebtRemoved).
func settleConfig(path string, v ljson.Result, r *Rule) error {
	for _, f := range []struct {
		name string
		set  func(*SettleSpec) *StatusSet
	}{
		{"count_statuses", func(s *SettleSpec) *StatusSet { s.HasCount = true; return &s.Count }},
		{"reset_on_statuses", func(s *SettleSpec) *StatusSet { s.HasReset = true; return &s.Reset }},
	} {
		fv := v.Get(f.name)
		if !fv.Exists() {
			continue
		}
		set, err := statusSet(path+"."+f.name, fv)
		if err != nil {
			return err
		}
		*f.set(r.settleSpec()) = set
	}
	if s := r.Settle; s != nil && s.HasCount && s.HasReset && s.Count.overlaps(&s.Reset) {
		return errAt(path+".reset_on_statuses", "must not share a status with count_statuses: a status either counts or resets")
	}
	if r.Settle != nil && r.Delay.MaxReserved > 0 {
		return errAt(path+".max_reserved", "cannot be combined with count_statuses, reset_on_statuses or a response_* cost_source: "+
			"a reservation holds requests against a debt the bucket already carries; settle in a rule of its own")
	}
	if v.Get("max_debt").Exists() {
		return errAt(path+".max_debt", maxDebtRemoved)
	}
	response := r.Settle != nil && r.Settle.Response != ResponseNone
	for _, f := range []string{"pre_charge", "estimate_source", "strip_accept_encoding"} {
		if v.Get(f).Exists() && !response {
			return errAt(path+"."+f, `applies only to a cost known after the response (cost_source "response_header:...", "response_json:..." or "response_sse:...")`)
		}
	}
	if !response {
		return nil
	}
	if r.Limit.Window > 0 {
		return errAt(path+".cost_source", "a cost known after the response needs a token_bucket, whose balance may go into debt; fixed windows have none")
	}
	// The reservation: a tenth of the burst unless set, so that the
	// requests in flight on one key before any reports its usage are
	// bounded (docs/configuration.md, "Reserving at admission").
	r.Settle.PreCharge = r.Limit.Burst / DefaultReserveShare
	if pc := v.Get("pre_charge"); pc.Exists() {
		n, err := nonNegative(path+".pre_charge", pc, r.Limit.Burst)
		if err != nil {
			return err
		}
		r.Settle.PreCharge = n
	}
	if es := v.Get("estimate_source"); es.Exists() {
		kind, name, ok := CostFixed, "", es.Type == ljson.String
		if arg, isJSON := strings.CutPrefix(es.Str, "request_json:"); ok && isJSON {
			ps, err := pointers(path+".estimate_source", "request_json", arg)
			if err != nil {
				return err
			}
			kind, r.Settle.EstimatePointers = CostRequestJSON, ps
		} else if ok {
			kind, name, ok = parseCostSource(es.Str)
		}
		if !ok || kind == CostFixed {
			return errAt(path+".estimate_source", `must be "header:<name>", "query:<name>" or "request_json:<JSON pointers>", got `+short(es.Raw))
		}
		r.Cost.Estimate, r.Cost.EstimateName = kind, name
	}
	if sa := v.Get("strip_accept_encoding"); sa.Exists() {
		if sa.Type != ljson.True && sa.Type != ljson.False {
			return errAt(path+".strip_accept_encoding", "must be true or false, got "+short(sa.Raw))
		}
		if r.Settle.Response == ResponseHeader {
			return errAt(path+".strip_accept_encoding", "applies only to a cost read from the body (response_json or response_sse)")
		}
		r.Settle.StripAcceptEncoding = sa.Bool()
	}
	// Every reported cost is carried in full: the debt it leaves is repaid
	// by the refill, never forgiven (issue 22). The floor is only the
	// largest value a balance is stored with, -1e12 tokens.
	r.Limit.MaxDebt = maxBurst
	r.Cost.Kind, r.Cost.PreCharge, r.Cost.Burst = CostResponse, r.Settle.PreCharge, r.Limit.Burst
	return nil
}

// nonNegative returns v as a finite number in [0, max].
func nonNegative(path string, v ljson.Result, max float64) (float64, error) {
	if v.Type != ljson.Number {
		return 0, errAt(path, "must be a number, got "+typeName(v))
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, errAt(path, "must be a finite number, got "+short(v.Raw))
	}
	if f < 0 || f > max {
		return 0, errAt(path, "must be from 0 to "+num(max)+", got "+num(f))
	}
	return f, nil
}

// InFlightSpec is a concurrency rule's limit ("algorithm": "concurrency").
type InFlightSpec struct {
	_ incomparable
	// Max is how many requests of one key may be in flight at once
	// ("max_in_flight").
	Max int64
	// Lease is the lease period in seconds ("lease_seconds", default 600):
	// a count no stream released (its VM died) is dropped after between
	// one and two lease periods; it must exceed the longest request.
	Lease float64
}

// bucketForInFlight is the bucket.Limit that describes a concurrency rule
// in the RateLimit-Policy header: a quota of max_in_flight.
func bucketForInFlight(spec *InFlightSpec) bucket.Limit {
	n := float64(spec.Max)
	return bucket.Limit{Rate: n, Burst: n}
}

// concurrencyConfig reads a concurrency rule's algorithm_config.
func concurrencyConfig(path string, v ljson.Result, r *Rule) error {
	if err := object(path, v, "max_in_flight", "lease_seconds"); err != nil {
		return err
	}
	m := v.Get("max_in_flight")
	if !m.Exists() {
		return errAt(path+".max_in_flight", "is required")
	}
	n, ok := integer(m)
	if !ok || n < 1 || n > maxInFlight {
		return errAt(path+".max_in_flight", "must be an integer from 1 to "+strconv.Itoa(maxInFlight)+", got "+short(m.Raw))
	}
	spec := &InFlightSpec{Max: n, Lease: defaultLeaseSeconds}
	if l := v.Get("lease_seconds"); l.Exists() {
		lease, err := positive(path+".lease_seconds", l, maxLeaseSeconds)
		if err != nil {
			return err
		}
		if lease < 1 {
			return errAt(path+".lease_seconds", "must be >= 1, got "+num(lease))
		}
		spec.Lease = lease
	}
	r.InFlight = spec
	// The headers' plan describes the limit as a quota of max_in_flight.
	r.Limit = bucketForInFlight(spec)
	r.Cost = CostSource{Kind: CostFixed, Fixed: 1, Default: 1}
	return nil
}
