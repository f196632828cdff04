package filter

import (
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/ratelimitheader"
)

// rule is the runtime state of one configured rule on this worker: the
// parsed rule, which nothing changes, and what the filter keeps for it.
// OnConfigure builds one per rule of the configuration (newRules); the
// streams of that configuration point at them.
type rule struct {
	_ incomparable
	*config.Rule
	// metrics are the rule's counters, defined with the host.
	metrics ruleMetrics
	// plan is what the RateLimit headers say about the rule that does not
	// depend on the request.
	plan ratelimitheader.Plan
	// waiting counts the requests the rule's reservation holds on this
	// worker (delay.go).
	waiting int
}

// policy is a configured policy with its rules' runtime state.
type policy struct {
	*config.Policy
	rules []*rule
	// fallback applies when no rule of the policy applies; nil if none.
	fallback *rule
}

// ruleSet is the runtime state of one configuration.
type ruleSet struct {
	// rules are every rule, fallbacks included, in configuration order
	// (config.Config.Rules).
	rules    []*rule
	policies []policy
}

// newRules builds the runtime state of cfg's rules, defining their metrics
// with h. It walks the policies as config.Parse lists cfg.Rules(): each
// policy's rules, then its fallback. (No map from parsed to runtime rule:
// a map type costs the module tens of kilobytes.)
func newRules(cfg *config.Config, h Host) ruleSet {
	set := ruleSet{rules: make([]*rule, 0, len(cfg.Rules())), policies: make([]policy, len(cfg.Policies))}
	add := func(cr *config.Rule) *rule {
		r := &rule{Rule: cr, plan: ratelimitheader.NewPlan(cr.Name, cr.Limit)}
		r.plan.PrepareHeaders() // for a native host's AppendHeaders; nothing in the guest
		r.defineMetrics(h)
		set.rules = append(set.rules, r)
		return r
	}
	for i, cp := range cfg.Policies {
		pol := &set.policies[i]
		pol.Policy, pol.rules = cp, make([]*rule, len(cp.Rules))
		for j, cr := range cp.Rules {
			pol.rules[j] = add(cr)
		}
		if cp.Fallback != nil {
			pol.fallback = add(cp.Fallback)
		}
	}
	return set
}

// incomparable is a zero-width field that makes a struct not comparable
// (as net/http's): the compiler then generates no equality function for
// it, which the module would carry (a few hundred bytes each, with its
// function table entries) though nothing compares the struct. Put it first:
// last, a zero-width field adds padding.
type incomparable [0]func()
