package config

import "strconv"

// Warnings returns what tokengate-local -check points out in a
// configuration Parse accepted: settings that are legal but leave a way
// around a limit, each in one line. The filter does not call it (it stays
// out of the wasm module).
//
//   - A rule of a policy in enforce mode without a fallback_limit that a
//     request can escape (a match on a header, query parameter or JWT
//     claim, as in a tier set; or such a limit key with "on_missing_key":
//     "skip") when no other rule of the policy limits every request in
//     its scope (its path, method and host conditions). A request that
//     escapes is not limited: a tier set must have a fallback.
//   - A fallback_limit that skips requests lacking its limit key.
//   - reset_on_statuses on a rule keyed by the client address alone: one
//     successful login from an address refills the failed-login budget of
//     every guess from it.
func Warnings(cfg *Config) []string {
	var out []string
	for _, pol := range cfg.Policies {
		if pol.Shadow {
			continue
		}
		where := "policy " + strconv.Quote(pol.ID)
		if fb := pol.Fallback; fb != nil {
			if d, ok := missable(fb); ok {
				out = append(out, where+": fallback_limit "+strconv.Quote(fb.Name)+" skips a request without "+d.String()+
					`, which is then not limited: give it "on_missing_key": "shared" or "deny"`)
			}
			continue
		}
		why := ""
		for _, r := range pol.Rules {
			reason := escape(r)
			if reason == "" || covered(pol, r) {
				continue
			}
			if why != "" {
				why += "; "
			}
			why += r.Name + ": " + reason
		}
		if why != "" {
			out = append(out, where+": a request these rules skip is limited by no other rule ("+why+
				`): add a fallback_limit (a policy bundle), or a rule without that match whose keys every request has or that says "on_missing_key": "shared" or "deny"`)
		}
	}
	for _, r := range cfg.rules {
		if r.Settle == nil || !r.Settle.HasReset || r.Shadow {
			continue
		}
		userKey := false
		for _, d := range r.Keys {
			userKey = userKey || missableKind(d.Kind)
		}
		if !userKey {
			out = append(out, "rule "+strconv.Quote(r.Name)+": reset_on_statuses without a key naming the user lets one success "+
				"(a valid login to the attacker's own account) refill the budget of every failed guess from the same address: "+
				`key by address and user, "limit_keys": ["ip:address", "<the user's descriptor>"]`)
		}
	}
	return out
}

// escape returns why a request in r's scope (its path, method and host
// conditions) can escape r, "" if none can: a match on a value a request
// can lack or change (a header, query parameter or claim), or a limit key
// it can lack when r skips such requests.
func escape(r *Rule) string {
	for _, m := range r.Match {
		if missableKind(m.Descriptor.Kind) {
			return "match " + m.Descriptor.String()
		}
	}
	if d, ok := missable(r); ok {
		return "limit key " + d.String()
	}
	return ""
}

// covered reports whether another rule of pol limits every request in r's
// scope: one no request can escape whose scope contains r's (its path,
// method and host conditions are among r's).
func covered(pol *Policy, r *Rule) bool {
	for _, o := range pol.Rules {
		if o == r || escape(o) != "" {
			continue
		}
		inside := true
		for _, m := range o.Match {
			found := false
			for _, n := range r.Match {
				found = found || (n.Descriptor == m.Descriptor && n.Value == m.Value)
			}
			inside = inside && found
		}
		if inside {
			return true
		}
	}
	return false
}

func missableKind(k DescriptorKind) bool {
	return k == DescHeader || k == DescQuery || k == DescJWT
}

// missable returns the first limit key of r that a request can lack, when r
// skips such requests.
func missable(r *Rule) (Descriptor, bool) {
	if r.OnMissingKey != MissingKeySkip {
		return Descriptor{}, false
	}
	for _, d := range r.Keys {
		if missableKind(d.Kind) {
			return d, true
		}
	}
	return Descriptor{}, false
}
