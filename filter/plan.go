package filter

import "strconv"

// This file holds what the request path needs precomputed at configuration
// time, and the optional host methods it uses to avoid copies. Inside the
// wasm guest every allocation costs hundreds of nanoseconds and every
// strconv call dozens of Go calls, so the request path formats into reused
// buffers and builds nothing it could have built once.

// rulePlan is what Rule.compile precomputes: the parts of the RateLimit
// headers that do not depend on the request.
type rulePlan struct {
	compiled bool
	// limit is the ratelimit-limit value: the whole tokens of a full bucket.
	limit string
	// policy is the ratelimit-policy value: "<rule>";q=<burst>;w=<window>.
	policy string
	// quoted is the RateLimit header's first field, "<rule>".
	quoted string
}

// compile fills r.plan; ParseConfig calls it on every rule it returns.
func (r *Rule) compile() {
	limit := strconv.FormatInt(int64(r.Limit.Burst), 10)
	window := seconds(r.Limit.FillTime())
	if r.Limit.Window > 0 {
		// A fixed window's quota is its limit per window (capacity may let
		// unused tokens roll over beyond it).
		limit, window = strconv.FormatInt(int64(r.Limit.Rate), 10), seconds(r.Limit.Window)
	}
	quoted := strconv.Quote(r.Name)
	r.plan = rulePlan{
		compiled: true,
		limit:    limit,
		policy:   quoted + ";q=" + limit + ";w=" + strconv.FormatInt(window, 10),
		quoted:   quoted,
	}
}

// planOf returns r's plan, compiling it for a Rule built by hand.
func (r *Rule) planOf() *rulePlan {
	if !r.plan.compiled {
		r.compile()
	}
	return &r.plan
}

// sourceAddress is the path of the client address property, allocated once
// (a variadic call through an interface would allocate it per request).
var sourceAddress = []string{"source", "address"}

// setHeader sets a response header from buf.
func (p *Plugin) setHeader(name string, buf []byte) {
	if p.hbs != nil {
		p.hbs.SetResponseHeaderBytes(name, buf)
		return
	}
	p.host.SetResponseHeader(name, string(buf))
}
