package filter

import (
	"encoding/base64"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// This file keeps collect as it was before it built keys in the same pass
// that finds the rules (two passes: the rules and their values, then every
// group's keys once the slot seed was refreshed), as the reference
// TestCollectMatchesTwoPass holds the one-pass collect to.

func (p *Plugin) refCollect(st *reqState) bool {
	req := &st.req
	spans := map[*group][]keySpans{}
	slotted := false
	for i := range p.rules.policies {
		pol := &p.rules.policies[i]
		if !selectorMatches(&pol.Selector, req) {
			continue
		}
		applied := false
		for _, r := range pol.rules {
			if r.matches(req) && p.refAdd(st, r) {
				applied = true
				slotted = slotted || r.MaxKeys > 0
			}
		}
		if !applied && pol.fallback != nil && p.refAdd(st, pol.fallback) {
			slotted = slotted || pol.fallback.MaxKeys > 0
		}
	}
	if !st.applies() {
		return false
	}
	if slotted {
		if seed, ok := p.seeds.Current(p.time()); ok {
			p.seed = seed
		} else {
			p.refreshSeed()
		}
	}
	for _, g := range [...]*group{&st.enforce, &st.shadow, &st.cluster, &st.lease, &st.inflight} {
		if len(g.rules) > 0 {
			spans[g] = p.refBuildKeys(st, g)
		}
	}
	keys := p.view(st.keyBuf)
	for g, sps := range spans {
		for i := range g.reqs {
			sp, r := &sps[i], &g.reqs[i]
			r.Key = keys[sp.key[0]:sp.key[1]]
			r.Alt = keys[sp.alt[0]:sp.alt[1]]
			r.Owner = keys[sp.owner[0]:sp.owner[1]]
		}
	}
	return true
}

func (p *Plugin) refAdd(st *reqState, r *rule) bool {
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
	g.rules = append(g.rules, r)
	g.reqs = append(g.reqs, sharedstate.Request{Limit: r.Limit, Cost: costOf(&r.Cost, req), Slotted: r.MaxKeys > 0 && r.Lease == nil})
	if r.WindowStart != config.WindowAligned {
		g.reqs[len(g.reqs)-1].Limit.Offset = r.windowOffset(st.vals[start:])
	}
	g.vals = append(g.vals, [2]int{start, len(st.vals)})
	return true
}

func (p *Plugin) refBuildKeys(st *reqState, g *group) []keySpans {
	var spans []keySpans
	for i, r := range g.rules {
		vals := st.vals[g.vals[i][0]:g.vals[i][1]]
		var sp keySpans
		if r.Lease != nil {
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
			st.keyBuf = sharedstate.AppendComposite(st.keyBuf, vals)
			sp.owner[1] = len(st.keyBuf)
			a, b := sharedstate.SlotPairBytes(p.seed, st.keyBuf[sp.owner[0]:], uint32(r.MaxKeys))
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
		spans = append(spans, sp)
	}
	return spans
}

// equivHost is the host of one plugin of TestCollectMatchesTwoPass: the
// current request's headers and source address, counters, logs dropped,
// and shared data in the store both plugins share. Whatever else of Host
// collect would call panics on the nil Host.
type equivHost struct {
	Host
	store    sharedstate.Store
	headers  map[string]string
	addr     string
	counters map[uint32]int64
}

func (h *equivHost) Get(key string) ([]byte, uint32, error) { return h.store.Get(key) }
func (h *equivHost) Set(key string, v []byte, cas uint32) error {
	return h.store.Set(key, v, cas)
}
func (h *equivHost) Log(LogLevel, string) {}
func (h *equivHost) DefineCounter(name string) (uint32, error) {
	return uint32(len(h.counters)), nil
}
func (h *equivHost) IncrementCounter(id uint32, delta int64) { h.counters[id] += delta }
func (h *equivHost) RequestHeader(name string) (string, bool) {
	v, ok := h.headers[name]
	return v, ok
}
func (h *equivHost) RequestHeaderAll(name string) (string, bool) { return h.RequestHeader(name) }
func (h *equivHost) Property(path ...string) ([]byte, bool) {
	if len(path) == 2 && path[0] == "source" && path[1] == "address" && h.addr != "" {
		return []byte(h.addr), true
	}
	return nil, false
}

// viewHost is an equivHost that offers views of the filter's buffers, as
// filter/abi and filter/dynmod do.
type viewHost struct{ *equivHost }

func (viewHost) ViewString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// collected is what collect left in a request's state, as values.
type collected struct {
	Applies bool
	Denied  string
	Groups  [5]collectedGroup
}

type collectedGroup struct {
	Rules []string
	Reqs  []sharedstate.Request
	Vals  [][]string
}

func snapshot(applies bool, st *reqState) collected {
	c := collected{Applies: applies}
	if st.denied != nil {
		c.Denied = st.denied.Name
	}
	for i, g := range [...]*group{&st.shadow, &st.inflight, &st.enforce, &st.lease, &st.cluster} {
		cg := &c.Groups[i]
		for j, r := range g.rules {
			cg.Rules = append(cg.Rules, r.Name)
			cg.Vals = append(cg.Vals, slices.Clone(st.vals[g.vals[j][0]:g.vals[j][1]]))
		}
		cg.Reqs = slices.Clone(g.reqs)
	}
	return c
}

// TestCollectMatchesTwoPass: collect, which builds each bucket's keys as
// it finds the bucket, leaves every request's state as the two-pass
// collect it replaced (refCollect) does: the same buckets in the same
// groups and order, the same requests (keys, slots, owners, limits,
// costs, window offsets), limit-key values, denial, answer and counters.
// Two plugins share one store, so one slot seed, and one clock; requests
// vary every descriptor, miss limit keys under each on_missing_key, and
// cross the seed's refresh, with hosts that offer views and hosts that do
// not.
func TestCollectMatchesTwoPass(t *testing.T) {
	const rls = `"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}`
	configs := map[string]string{
		"one per-ip rule": `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}]}`,
		"max_keys 1 and unbounded": `{"rules":[
			{"name":"one","limit_keys":["ip:address"],"max_keys":1,"algorithm_config":{"rps":10,"burst":20}},
			{"name":"unb","limit_keys":["header:x-api-key","path"],"max_keys":0,"algorithm_config":{"rps":10,"burst":20}},
			{"name":"few","limit_keys":["header:x-api-key"],"max_keys":7,"on_missing_key":"shared","algorithm_config":{"rps":1,"burst":2}}]}`,
		"missing keys": `{"rules":[
			{"name":"skip","limit_keys":["header:x-user"],"algorithm_config":{"rps":10,"burst":20}},
			{"name":"shared","limit_keys":["header:x-user","ip:address"],"on_missing_key":"shared","algorithm_config":{"rps":10,"burst":20}},
			{"name":"deny","limit_keys":["jwt:sub"],"on_missing_key":"deny","algorithm_config":{"rps":10,"burst":20}},
			{"name":"deny2","limit_keys":["query:k"],"on_missing_key":"deny","algorithm_config":{"rps":10,"burst":20}}]}`,
		"windows and costs": `{"rules":[
			{"name":"fw","limit_keys":["header:x-api-key"],"algorithm":"fixed_window","algorithm_config":{"limit":3,"window_seconds":10,"window_start":"hash"}},
			{"name":"fa","limit_keys":["host"],"algorithm":"fixed_window","algorithm_config":{"limit":3,"window_seconds":60}},
			{"name":"cost","limit_keys":["method","query:k"],"algorithm_config":{"rps":5,"burst":50,"cost_source":"header:x-cost","default_cost":2}},
			{"name":"cc","limit_keys":["ip:address"],"algorithm":"concurrency","algorithm_config":{"max_in_flight":2}},
			{"name":"cc-all","algorithm":"concurrency","algorithm_config":{"max_in_flight":9}}]}`,
		"policies": `{"bundle_version":1,"policies":[
			{"id":"api","spec":{"selector":{"pathPrefix":"/api/"},"rules":[
				{"name":"api-key","limit_keys":["header:x-api-key"],"match":{"method":"GET"},"algorithm_config":{"rps":1,"burst":2}},
				{"name":"api-ip","limit_keys":["ip:address"],"match":{"header:x-tier":"free"},"algorithm_config":{"rps":1,"burst":2}}],
				"fallback_limit":{"algorithm_config":{"rps":3,"burst":4}}}},
			{"id":"watch","spec":{"mode":"shadow","selector":{"methods":["get","post"],"hosts":["*.example.com"]},"rules":[
				{"name":"sh-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":1}},
				{"name":"sh-key","limit_keys":["header:x-api-key"],"on_missing_key":"deny","max_keys":3,"algorithm_config":{"rps":1,"burst":1}}]}},
			{"id":"rest","spec":{"fallback_limit":{"limit_keys":["host"],"algorithm_config":{"rps":3,"burst":4}}}}]}`,
		"cluster and lease": `{"rules":[
			{"name":"local-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}},
			{"name":"global","scope":"cluster","limit_keys":["ip:address","header:x-api-key"],"algorithm_config":{"rps":5,"burst":10}},
			{"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,"limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}},
			{"name":"lease-key","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,"max_keys":5,"limit_keys":["header:x-api-key"],"algorithm_config":{"rps":10,"burst":20}}],
			` + rls + `}}`,
		"ipv6 prefix": `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}],"settings":{"ipv6_prefix":56}}`,
	}
	long := strings.Repeat("a", 70)
	addrs := []string{"10.0.0.1:4000", "192.0.2.255", "[2001:db8::1]:80", "[::ffff:10.1.2.3]:9", "2001:db8:1:2:3:4:5:6", "not-an-ip", ""}
	keys := []string{"", "k1", "key with spaces|pipe%", long, "é", "$x"}
	paths := []string{"/api/items", "/api/items?k=v1", "/other?k=%zz", "/", "/api/x?k=a+b&k=c"}
	methods := []string{"GET", "POST", "delete", ""}
	hosts := []string{"api.example.com", "Example.COM.", "other.test:8080", ""}
	rnd := rand.New(rand.NewPCG(29, 1))
	pick := func(s []string) string { return s[rnd.IntN(len(s))] }
	enc := base64.RawURLEncoding.EncodeToString
	seen := map[string]int{} // what the requests exercised, over every configuration
	for name, cfg := range configs {
		for _, views := range []bool{true, false} {
			t.Run(name+"/views="+strconv.FormatBool(views), func(t *testing.T) {
				store := sharedstatetest.New(sharedstate.Envoy)
				now := 1000.0
				var hs [2]*equivHost
				var ps [2]*Plugin
				var ss [2]*Stream
				for i := range ps {
					hs[i] = &equivHost{store: store, counters: map[uint32]int64{}}
					var h Host = hs[i]
					if views {
						h = viewHost{hs[i]}
					}
					ps[i] = NewPlugin(h)
					ps[i].Clock = func() float64 { return now }
					if !ps[i].OnConfigure([]byte(cfg)) {
						t.Fatalf("configuration refused: %s", cfg)
					}
					ss[i] = ps[i].NewStream()
				}
				for n := range 400 {
					now += 0.35 // the seed is refreshed once a second
					headers := map[string]string{":path": pick(paths), ":method": pick(methods), ":authority": pick(hosts)}
					for _, h := range []string{"x-api-key", "x-user", "x-tier", "x-cost"} {
						if v := pick(keys); v != "" || rnd.IntN(2) == 0 {
							headers[h] = v
						}
					}
					if rnd.IntN(3) > 0 {
						headers["x-tier"] = "free"
						headers["x-cost"] = strconv.Itoa(rnd.IntN(5))
					}
					if rnd.IntN(2) == 0 {
						headers["authorization"] = "Bearer " + enc([]byte(`{}`)) + "." + enc([]byte(`{"sub":"`+pick(keys)+`"}`)) + ".s"
					}
					addr := pick(addrs)
					var got [2]collected
					for i := range ps {
						hs[i].headers, hs[i].addr = headers, addr
						st := &ss[i].st
						st.begin(ps[i])
						var applies bool
						if i == 0 {
							applies = ps[i].refCollect(st)
						} else {
							applies = ps[i].collect(st)
						}
						got[i] = snapshot(applies, st)
						ps[i].buf.nowSet = false // the callback's end
					}
					if !reflect.DeepEqual(got[0], got[1]) {
						t.Fatalf("request %d (headers %v, address %q):\ntwo-pass %+v\none-pass %+v", n, headers, addr, got[0], got[1])
					}
					if !maps.Equal(hs[0].counters, hs[1].counters) {
						t.Fatalf("request %d: counters %v, two-pass %v", n, hs[1].counters, hs[0].counters)
					}
					if ps[0].seed != ps[1].seed {
						t.Fatalf("request %d: seeds differ", n)
					}
					if got[1].Applies {
						seen[name]++
					}
					if got[1].Denied != "" {
						seen["denied"]++
					}
					for i, g := range got[1].Groups {
						if len(g.Reqs) > 0 {
							seen["group "+strconv.Itoa(i)]++
						}
						for _, r := range g.Reqs {
							if r.Slotted && r.Alt != "" {
								seen["two slots"]++
							}
							if r.Limit.Offset != 0 {
								seen["window offset"]++
							}
						}
					}
				}
			})
		}
	}
	want := []string{"denied", "group 0", "group 1", "group 2", "group 3", "group 4", "two slots", "window offset"}
	for name := range configs {
		want = append(want, name)
	}
	for _, k := range want {
		if seen[k] == 0 {
			t.Errorf("no request exercised %q", k)
		}
	}
}
