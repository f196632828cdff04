package filter

import (
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/config"
)

// admitPositive is the admission cost of a response_* rule with
// pre_charge 0: the smallest positive float64, so that bucket.Limit.Take
// admits exactly while the balance is above zero (tokens >= 5e-324 is
// tokens > 0), not at zero or in debt, and takes nothing a stored balance
// could show (x - 5e-324 rounds back to x for every balance above 2^-1022;
// the codec keeps 6 decimals). The bucket package stays as it is: its Take
// is the hot path and its Limit must not grow (BENCHMARKS.md, row 1).
// The settlement counts admission as having taken 0 (Stream.track).
const admitPositive = math.SmallestNonzeroFloat64

// maxCostLen bounds the cost header or parameter the filter parses.
const maxCostLen = 32

// costOf returns the number of tokens the request takes under cost source
// c.
func costOf(c *config.CostSource, req *request) float64 {
	switch c.Kind {
	case config.CostFixed:
		return c.Fixed
	case config.CostResponse:
		return reservation(c, req)
	}
	if v, ok := stated(c.Kind, c.Name, req); ok {
		return v
	}
	return c.Default
}

// stated returns the cost a request states in the header or query
// parameter name (kind CostHeader or CostQuery), if it is a valid one.
func stated(kind config.CostKind, name string, req *request) (float64, bool) {
	var raw string
	var ok bool
	if kind == config.CostHeader {
		raw, ok = req.header(name)
	} else {
		req.loadPath()
		raw, ok = queryParam(req.query, name)
	}
	if !ok {
		return 0, false
	}
	return ParseCost(raw)
}

// reservation is what a response-cost rule reserves at admission: the
// request's own estimate (estimate_source) when it states a valid one above
// pre_charge, at most the burst; else pre_charge (admitPositive for 0).
// The estimate is never less than pre_charge: a client that understates it
// cannot have more of its requests in flight than pre_charge allows.
func reservation(c *config.CostSource, req *request) float64 {
	v := c.PreCharge
	if c.Estimate != config.CostFixed {
		if e, ok := stated(c.Estimate, c.EstimateName, req); ok && e > v {
			v = min(e, c.Burst)
		}
	}
	if v > 0 {
		return v
	}
	return admitPositive
}

// ParseCost parses a cost from a header or query value: a plain decimal
// number of at least 0.000001 ("5", "2.5"), optionally surrounded by spaces
// or tabs, at most 32 characters. Signs, exponents, hex, "NaN", "Inf", zero,
// smaller numbers and anything else are rejected (ok is false) and the
// rule's default_cost applies.
func ParseCost(s string) (v float64, ok bool) {
	s = strings.Trim(s, " \t")
	if s == "" || len(s) > maxCostLen {
		return 0, false
	}
	dot := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
		case c == '.' && !dot && i > 0 && i < len(s)-1:
			dot = true
		default:
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < minCost || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// minCost is the smallest cost a header or parameter may state: the
// resolution of stored token counts. A smaller cost would take nothing at
// all, so a client that sets its own cost could pass for free.
const minCost = 1e-6
