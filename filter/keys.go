package filter

import (
	"math/rand/v2"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/sharedstate"
)

// This file finds the buckets a request takes from and builds their keys:
// collect fills the groups of the request's reqState.

// group is the set of buckets one request takes from in one mode.
type group struct {
	rules []*rule
	reqs  []sharedstate.Request
	res   []bucket.Result
	// vals locate each bucket's limit-key values in reqState.vals.
	vals [][2]int
}

// keySpans are [start, end) offsets in reqState.keyBuf of a request's Key,
// Alt and Owner; an empty span ([0, 0)) is an empty string.
type keySpans struct {
	key, alt, owner [2]int
}

// setKeys points q's Key, Alt and Owner, which are empty, into keys: a
// string of keyBuf from offset base on.
func (sp *keySpans) setKeys(q *sharedstate.Request, keys string, base int) {
	q.Key = keys[sp.key[0]-base : sp.key[1]-base]
	if sp.alt[1] != 0 {
		q.Alt = keys[sp.alt[0]-base : sp.alt[1]-base]
	}
	if sp.owner[1] != 0 {
		q.Owner = keys[sp.owner[0]-base : sp.owner[1]-base]
	}
}

// keyed is where collect put a bucket of the request and its keys, for a
// host without views (bytesViewer): its group and index there, and its
// keys' spans in keyBuf until collect copies the buffer into one string.
type keyed struct {
	g *group
	i int
	keySpans
}

func (g *group) reset() {
	if len(g.rules) != 0 { // every group that has buckets has rules
		g.rules, g.reqs, g.vals = g.rules[:0], g.reqs[:0], g.vals[:0]
	}
}

// extend appends o's buckets, whose keys are set, to g.
func (g *group) extend(o *group) {
	g.rules = append(g.rules, o.rules...)
	g.reqs = append(g.reqs, o.reqs...)
	g.vals = append(g.vals, o.vals...)
}

// view returns b as a string: a view of b's bytes where the host offers one
// (b must then stay untouched while the string is in use), otherwise a copy.
func (p *Plugin) view(b []byte) string {
	if p.bv != nil {
		return p.bv.ViewString(b)
	}
	return string(b)
}

// collect fills the groups of st with the buckets the request takes from,
// and reports whether there are any: in every policy whose selector
// matches, every rule whose match holds and whose limit keys are all
// present; the policy's fallback limit when none is. One pass: add builds
// each bucket's keys as it finds the bucket. The slot seed is refreshed
// once, before the first slot is chosen, and only for a request that has
// a rule with max_keys. The keys are views of keyBuf, which stays
// untouched until the next request, made as each bucket is added (the
// bytes of a view stay as they are if keyBuf grows: append leaves the old
// array alone); a host without views gets them in one copy of keyBuf,
// made once every bucket is added.
func (p *Plugin) collect(st *reqState) bool {
	req := &st.req
	for i := range p.rules.policies {
		pol := &p.rules.policies[i]
		if !matchesAll(&pol.Selector) && !selectorMatches(&pol.Selector, req) {
			continue
		}
		applied := false
		for _, r := range pol.rules {
			if (len(r.Match) == 0 || r.matches(req)) && p.add(st, r) {
				applied = true
			}
		}
		if !applied && pol.fallback != nil {
			p.add(st, pol.fallback)
		}
	}
	if len(st.keyed) > 0 {
		keys := string(st.keyBuf)
		for i := range st.keyed {
			k := &st.keyed[i]
			k.setKeys(&k.g.reqs[k.i], keys, 0)
		}
	}
	return st.applies()
}

func (r *rule) matches(req *request) bool {
	for _, m := range r.Match {
		if v, ok := req.value(m.Descriptor); !ok || v != m.Value {
			return false
		}
	}
	return true
}

// add appends r's bucket for this request to its group, with its limit-key
// values and its keys, and reports whether it did. An absent limit key is
// counted and does what the rule's on_missing_key says: the rule is
// skipped; or the value is empty, one bucket for every such request; or
// (deny) the rule is skipped and the request marked for denial (st.denied;
// a shadow rule only counts it).
func (p *Plugin) add(st *reqState, r *rule) bool {
	req := &st.req
	start := len(st.vals)
	for _, d := range r.Keys {
		v, ok := req.value(d)
		if !ok {
			r.metrics.descriptorMissing.inc(p.host, 1)
			switch r.OnMissingKey {
			case config.MissingKeyShared:
				st.vals = append(st.vals, "")
				continue
			case config.MissingKeyDeny:
				if r.Shadow {
					r.metrics.shadowRejected.inc(p.host, 1)
				} else if st.denied == nil {
					st.denied = r
				}
			}
			st.vals = st.vals[:start]
			return false
		}
		st.vals = append(st.vals, v)
	}
	g := &st.enforce
	switch {
	case r.Lease != nil:
		g = &st.lease
	case r.InFlight != nil:
		g = &st.inflight
	case r.Cluster:
		g = &st.cluster
	case r.Shadow:
		g = &st.shadow
	}
	vals := st.vals[start:]
	g.rules = append(g.rules, r)
	g.reqs = append(g.reqs, sharedstate.Request{Limit: r.Limit, Cost: costOf(&r.Cost, req), Slotted: r.MaxKeys > 0 && r.Lease == nil})
	if r.WindowStart != config.WindowAligned {
		g.reqs[len(g.reqs)-1].Limit.Offset = r.windowOffset(vals)
	}
	g.vals = append(g.vals, [2]int{start, len(st.vals)})
	if r.MaxKeys > 0 && !st.seeded {
		// The first rule with max_keys of the request (a lease rule's
		// counts, as it always has, though it chooses no slot).
		st.seeded = true
		if seed, ok := p.seeds.Current(p.time()); ok {
			p.seed = seed // refreshSeed's common case, without its calls
		} else {
			p.refreshSeed()
		}
	}
	base := len(st.keyBuf)
	sp := p.appendKeys(st, r, vals)
	if p.bv != nil {
		sp.setKeys(&g.reqs[len(g.reqs)-1], p.bv.ViewString(st.keyBuf[base:]), base)
	} else {
		st.keyed = append(st.keyed, keyed{g: g, i: len(g.reqs) - 1, keySpans: sp})
	}
	return true
}

// appendKeys appends the keys of r's bucket, for limit-key values vals, to
// keyBuf and returns where they are; the slot seed must be fresh.
func (p *Plugin) appendKeys(st *reqState, r *rule, vals []string) (sp keySpans) {
	if r.Lease != nil {
		// The allowance key, the key of the bucket on_error: local
		// falls back to, and the composite key for the service.
		sp.key[0] = len(st.keyBuf)
		st.keyBuf = sharedstate.AppendLeaseKey(st.keyBuf, r.Name, vals)
		sp.key[1] = len(st.keyBuf)
		sp.alt[0] = len(st.keyBuf)
		st.keyBuf = sharedstate.AppendKey(st.keyBuf, false, r.Name, vals)
		sp.alt[1] = len(st.keyBuf)
		sp.owner[0] = len(st.keyBuf)
		st.keyBuf = sharedstate.AppendComposite(st.keyBuf, vals)
		sp.owner[1] = len(st.keyBuf)
	} else if r.MaxKeys > 0 {
		sp.owner[0] = len(st.keyBuf)
		var a, b uint32
		if fastPaths { // natively: one call and one pass; the guest stays smaller
			st.keyBuf, a, b = sharedstate.AppendOwnerSlots(st.keyBuf, p.seed, vals, uint32(r.MaxKeys))
		} else {
			st.keyBuf = sharedstate.AppendComposite(st.keyBuf, vals)
			a, b = sharedstate.SlotPairBytes(p.seed, st.keyBuf[sp.owner[0]:], uint32(r.MaxKeys))
		}
		sp.owner[1] = len(st.keyBuf)
		sp.key[0] = len(st.keyBuf)
		st.keyBuf = sharedstate.AppendSlotKey(st.keyBuf, r.Shadow, r.Name, a)
		sp.key[1] = len(st.keyBuf)
		if r.MaxKeys > 1 {
			sp.alt[0] = len(st.keyBuf)
			st.keyBuf = sharedstate.AppendSlotKey(st.keyBuf, r.Shadow, r.Name, b)
			sp.alt[1] = len(st.keyBuf)
		}
	} else {
		sp.key[0] = len(st.keyBuf)
		st.keyBuf = sharedstate.AppendKey(st.keyBuf, r.Shadow, r.Name, vals)
		sp.key[1] = len(st.keyBuf)
	}
	if r.InFlight != nil {
		markInFlight(st.keyBuf[sp.key[0]:sp.key[1]], r.Shadow)
		markInFlight(st.keyBuf[sp.alt[0]:sp.alt[1]], r.Shadow)
	}
	return sp
}

// windowOffset is where a fixed window's windows start for the key with
// these limit-key values, in seconds after multiples of the window: chosen
// by the key's hash (the same on every worker and after a restart), or at
// random (used only when the key's state is created; the stored window
// start keeps it from then on, for every worker).
func (r *rule) windowOffset(vals []string) float64 {
	w := r.Limit.Window
	if r.WindowStart == config.WindowRandom {
		return rand.Float64() * w
	}
	h := fnv64(r.Name)
	for _, v := range vals {
		h = fnv64Add(fnv64Add(h, "\x00"), v)
	}
	const us = 1e6 // microsecond steps, as stored
	steps := uint64(w * us)
	if steps == 0 { // the parser refuses windows under 1 ms; never divide by 0
		return 0
	}
	return float64(h%steps) / us
}
