package rls_test

import (
	"context"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

func at(sec float64) string { return strconv.FormatFloat(sec, 'f', 6, 64) }

// TestLeaseScript walks the lease script through grants from several
// holders, the held-token cap on the refill, a report, a release, a stale
// report and expiry, at fixed instants, on a real Redis.
func TestLeaseScript(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	ctx := context.Background()
	const t0 = 1736940000.0
	key := redisstore.LeaseKey("r", "k")
	op := func(holder string, grant uint64, unspent float64, want uint64, release bool, now float64) redisstore.LeaseResult {
		t.Helper()
		res, err := store.Lease(ctx, redisstore.LeaseOp{Key: key, Rate: 10, Burst: 20, TTL: 2, Holder: holder, Grant: grant,
			Unspent: unspent, Want: want, Release: release, Now: at(now)})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	take := func(cost float64, now float64) redisstore.Outcome {
		t.Helper()
		o := store.Run(ctx, []redisstore.Op{{Key: key, Rate: 10, Burst: 20, Cost: cost, Lease: true, TTL: 2, Now: at(now)}})[0]
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		return o
	}

	steps := []struct {
		name string
		do   func() redisstore.LeaseResult
		want redisstore.LeaseResult // Retry and ValidUntil compared only when set
	}{
		{"A gets what it wants", func() redisstore.LeaseResult { return op("A", 0, 0, 8, false, t0) }, redisstore.LeaseResult{Granted: 8, ID: 1, Tokens: 12}},
		{"B too", func() redisstore.LeaseResult { return op("B", 0, 0, 8, false, t0) }, redisstore.LeaseResult{Granted: 8, ID: 2, Tokens: 4}},
		{"C gets the rest", func() redisstore.LeaseResult { return op("C", 0, 0, 8, false, t0) }, redisstore.LeaseResult{Granted: 4, ID: 3, Tokens: 0}},
		{"D finds none", func() redisstore.LeaseResult { return op("D", 0, 0, 8, false, t0) }, redisstore.LeaseResult{OverLimit: true, ID: 4, Tokens: 0, Retry: 0.1}},
		// 1 s later the refill would give 10, but 20 are held: L + H <= burst.
		{"held tokens cap the refill", func() redisstore.LeaseResult { return op("D", 4, 0, 8, false, t0+1) }, redisstore.LeaseResult{OverLimit: true, ID: 5, Tokens: 0}},
		// A reports 3 of its 8 unspent: 5 were spent, H falls to 15, and
		// that room fills at the rate from this call on.
		{"A reports 3 unspent", func() redisstore.LeaseResult { return op("A", 1, 3, 0, false, t0+1) }, redisstore.LeaseResult{Covered: 3, ID: 6, Tokens: 0}},
		{"the freed room refills", func() redisstore.LeaseResult { return op("D", 5, 0, 8, false, t0+1.5) }, redisstore.LeaseResult{Granted: 5, ID: 7, Tokens: 0}},
		// B returns 6 of grant 2: they go back to L.
		{"B releases 6", func() redisstore.LeaseResult { return op("B", 2, 6, 0, true, t0+1.5) }, redisstore.LeaseResult{Granted: 6, Tokens: 6}},
		// A stale report (grant 1 is gone): nothing it claims is covered.
		{"stale report covers nothing", func() redisstore.LeaseResult { return op("A", 1, 8, 0, true, t0+1.5) }, redisstore.LeaseResult{Granted: 0, Tokens: 6}},
		// D renews grant 7 (5 tokens) reporting 2.5 unspent: 2 whole
		// tokens are carried over, and the answer says so.
		{"renewal carries over whole tokens", func() redisstore.LeaseResult { return op("D", 7, 2.5, 0, false, t0+1.5) }, redisstore.LeaseResult{Covered: 2, ID: 8, Tokens: 6}},
		// C's grant expired at t0+2: its room comes back from then on,
		// not its tokens. D now holds 2 under grant 8, A 3: H = 9 until
		// t0+2, L = min(20 - 9, 6 + 0.5 x 10) = 11; then the cap is 15
		// and L = min(15, 11 + 0.5 x 10) = 15.
		{"expiry frees capacity from the expiry on", func() redisstore.LeaseResult { return op("E", 0, 0, 20, false, t0+2.5) }, redisstore.LeaseResult{Granted: 15, ID: 9, Tokens: 0}},
	}
	for i, s := range steps {
		got := s.do()
		w := s.want
		if got.OverLimit != w.OverLimit || got.Granted != w.Granted || got.Covered != w.Covered || (w.ID != 0 && got.ID != w.ID) || got.Tokens != w.Tokens ||
			(w.Retry != 0 && got.Retry != w.Retry) {
			t.Fatalf("step %d (%s): got %+v, want %+v\n%v", i, s.name, got, w, srv.MustDo("HGETALL", key))
		}
	}
	// An exact take sees the same bucket: nothing is free.
	if o := take(1, t0+2.5); o.Allowed {
		t.Fatalf("exact take from an empty bucket allowed: %+v", o)
	}
	// H is 20 (A 3, D 2, E 15): nothing refills until A's grant expires
	// at t0+3; 0.25 s after that, 2.5 tokens, one taken.
	if o := take(1, t0+2.9); o.Allowed {
		t.Fatalf("exact take while every token is held: %+v", o)
	}
	if o := take(1, t0+3.25); !o.Allowed || o.Tokens != 1.5 {
		t.Fatalf("exact take 0.25 s after A's grant expired: %+v, want allowed with 1.5 left", o)
	}
	// The key lives until every grant has expired (E's at t0+4.5), and
	// then the time to refill to full ((20 - 1.5) / 10 s), plus 1 s: the
	// room a grant holds only refills once it has expired, so a key gone
	// earlier would come back full and admit those tokens twice.
	if pttl := srv.MustDo("PTTL", key).(int64); pttl < 4090 || pttl > 4100 {
		t.Fatalf("PTTL %d ms, want 1.25 + 1.85 + 1 s", pttl)
	}
	// NOSCRIPT is answered by EVAL.
	srv.MustDo("SCRIPT", "FLUSH")
	if got := op("F", 0, 0, 1, false, t0+10); got.Granted != 1 {
		t.Fatalf("after SCRIPT FLUSH: %+v", got)
	}
}

// applyGrant is what the filter does with a lease answer (filter/lease_call.go,
// leaseApply): the new grant's amount (Quota.requests = covered + granted)
// less what the proxy spent since it sent the report. tokens is what the
// proxy holds when the answer lands, unspent what it reported.
func applyGrant(tokens, unspent float64, res redisstore.LeaseResult) float64 {
	spent := unspent - min(tokens, unspent)
	return max(0, float64(res.Covered+res.Granted)-spent)
}

// applyGrantOld is the rule before the covered amount was part of the
// answer: what is left of the report plus the new tokens, whether or not
// the service still counted the report.
func applyGrantOld(tokens, unspent float64, res redisstore.LeaseResult) float64 {
	return min(tokens, unspent) + float64(res.Granted)
}

// TestLeaseLostAnswer is the audit's scenario on the real script: a
// renewal the service granted but whose answer the proxy never saw (a
// timeout), then the next renewal, which still names the old grant. The
// service no longer has that grant, so it carries nothing over, and says
// so; the proxy must then stop counting the tokens it reported. Once the
// unapplied grant expires and the bucket has refilled, exact takes plus
// what the proxy can still spend stay within the burst. With the old rule
// (keep what is left of the report and re-date it) they do not.
func TestLeaseLostAnswer(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	ctx := context.Background()
	const t0 = 1736940000.0
	const rate, burst, ttl = 100.0, 20.0, 2.0
	for _, tc := range []struct {
		name  string
		apply func(tokens, unspent float64, res redisstore.LeaseResult) float64
		over  bool
	}{{"covered rule", applyGrant, false}, {"old rule", applyGrantOld, true}} {
		t.Run(tc.name, func(t *testing.T) {
			key := redisstore.LeaseKey("lost", tc.name)
			lease := func(g uint64, u float64, want uint64, now float64) redisstore.LeaseResult {
				t.Helper()
				res, err := store.Lease(ctx, redisstore.LeaseOp{Key: key, Rate: rate, Burst: burst, TTL: ttl, Holder: "A", Grant: g,
					Unspent: u, Want: want, Now: at(now)})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			r := lease(0, 0, 10, t0)
			tokens, expiry, grant := tc.apply(0, 0, r), t0+ttl, r.ID
			if tokens != 10 {
				t.Fatalf("first grant: %v tokens", tokens)
			}
			// t0+0.5: a renewal reporting 10 unspent; the service carries
			// them into a new grant, the answer is lost.
			lost := lease(grant, tokens, 5, t0+0.5)
			if lost.Covered != 10 {
				t.Fatalf("renewal: %+v, want 10 carried over", lost)
			}
			// t0+1: the next renewal names the old grant, gone: nothing is
			// carried over, and the answer says so.
			r = lease(grant, tokens, 0, t0+1)
			if r.Covered != 0 {
				t.Fatalf("renewal naming a replaced grant: %+v, want nothing carried over", r)
			}
			tokens, expiry, grant = tc.apply(tokens, tokens, r), t0+1+ttl, r.ID
			_ = grant
			// t0+2.6: the lost grant expired at t0+2.5; the bucket refills
			// into its room, then exact takes drain it.
			now := t0 + 2.6
			for ; now < t0+2.8; now += 0.05 {
				store.Run(ctx, []redisstore.Op{{Key: key, Rate: rate, Burst: burst, Cost: 0, Lease: true, TTL: ttl, Now: at(now)}})
			}
			took := 0
			for range 40 {
				o := store.Run(ctx, []redisstore.Op{{Key: key, Rate: rate, Burst: burst, Cost: 1, Lease: true, TTL: ttl, Now: at(now)}})[0]
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				if o.Allowed {
					took++
				}
			}
			spendable := 0.0
			if now < expiry {
				spendable = tokens
			}
			over := float64(took)+spendable > burst
			t.Logf("%s: %d exact takes + %v spendable at one instant (burst %v)", tc.name, took, spendable, burst)
			if over != tc.over {
				t.Errorf("%s: %d exact takes + %v spendable, burst %v: over = %v, want %v", tc.name, took, spendable, burst, over, tc.over)
			}
		})
	}
}

// TestLeaseBound simulates proxies that lease, renew, spend (also while
// their call is in flight), release, lose answers, lose their claim and
// die, against the real script at fixed instants, and checks the accuracy
// bound of docs/lease.md on every window: the tokens spent in [t1, t2]
// never exceed burst + rate x (t2 - t1). A call is processed by the
// service some time after it is sent and answered some time after that;
// the proxy applies the answer as the filter does (applyGrant). The same
// simulation with the old rule (applyGrantOld) or without the held-token
// cap exceeds the bound, which shows the check can fail.
func TestLeaseBound(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	for _, tc := range []struct {
		name  string
		apply func(tokens, unspent float64, res redisstore.LeaseResult) float64
		over  bool
		share float64 // lease_max for the holders' shares; 0: none
	}{{"covered rule", applyGrant, false, 0}, {"old rule", applyGrantOld, true, 0},
		// Shares (issue 22) set free tokens aside for holders and never
		// grant beyond L: the bound holds with them.
		{"covered rule with shares", applyGrant, false, 8}} {
		t.Run(tc.name, func(t *testing.T) {
			worst := 0.0
			for round := range 3 {
				w, n, span := simulateLeases(t, store, redisstore.LeaseKey("bound-"+tc.name, strconv.Itoa(round)), int64(round), tc.apply, tc.share)
				t.Logf("round %d: %d tokens spent over %.1f s; worst window %+.3f tokens against burst + rate x T", round, n, span, w)
				if n < 1000 {
					t.Errorf("round %d: only %d tokens spent: the simulation did not load the bucket", round, n)
				}
				worst = max(worst, w)
			}
			if over := worst > 1e-6; over != tc.over {
				t.Errorf("worst window exceeds burst + rate x T by %.3f: over = %v, want %v", worst, over, tc.over)
			}
		})
	}
}

// simulateLeases runs one round of TestLeaseBound and returns by how much
// the worst window exceeded burst + rate x T (<= 0: within), the tokens
// spent and the simulated time.
func simulateLeases(t *testing.T, store *redisstore.Store, key string, seed int64, apply func(tokens, unspent float64, res redisstore.LeaseResult) float64, share float64) (float64, int, float64) {
	ctx := context.Background()
	const rate, burst, ttl = 50.0, 40.0, 0.5
	type call struct {
		sent, process, answer float64
		unspent               float64
		want                  uint64
		release, done, lost   bool
		res                   redisstore.LeaseResult
	}
	type proxy struct {
		name    string
		tokens  float64
		expiry  float64
		grant   uint64
		dead    bool
		spendAt float64 // spending speed, tokens per second
		call    *call
	}
	rng := rand.New(rand.NewPCG(7, uint64(seed)))
	proxies := []*proxy{{name: "hot", spendAt: 200}, {name: "b", spendAt: 20}, {name: "c", spendAt: 5}}
	var spent []float64 // one entry per token spent: its time
	t0 := 1736940000.0
	now := t0
	for step := 0; step < 1500; step++ {
		dt := float64(rng.IntN(60000)) / 1e6
		// Every 100 steps: a quiet spell (no spending, renewals only), in
		// which the bucket refills, then a rush in which every proxy
		// spends all it holds and exact takes drain the bucket: the
		// windows that would show tokens counted nowhere.
		quiet, rush := step%100 >= 70 && step%100 < 99, step%100 == 99
		if rush {
			for _, p := range proxies {
				for !p.dead && now < p.expiry && p.tokens >= 1 {
					p.tokens--
					spent = append(spent, now)
				}
			}
			for range int(burst) + 1 {
				o := store.Run(ctx, []redisstore.Op{{Key: key, Rate: rate, Burst: burst, Cost: 1, Lease: true, TTL: ttl, LeaseShare: share, Now: at(now)}})[0]
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				if o.Allowed {
					spent = append(spent, now)
				}
			}
		}
		// Spending happens over (now, now+dt]: whole tokens, before the
		// allowance's expiry, calls in flight or not.
		for _, p := range proxies {
			if p.dead || quiet {
				continue
			}
			n := int(p.spendAt * dt * rng.Float64() * 2)
			for i := 0; i < n && p.tokens >= 1; i++ {
				ts := now + dt*float64(i+1)/float64(n+1)
				if ts >= p.expiry {
					break
				}
				p.tokens--
				spent = append(spent, ts)
			}
		}
		now += dt
		// The service processes the calls whose time has come, then the
		// answers land (or are lost, or dropped: a lost claim).
		for _, p := range proxies {
			c := p.call
			if c == nil {
				continue
			}
			if !c.done && now >= c.process {
				var err error
				c.res, err = store.Lease(ctx, redisstore.LeaseOp{Key: key, Rate: rate, Burst: burst, TTL: ttl, Holder: p.name,
					Grant: p.grant, Unspent: c.unspent, Want: c.want, Release: c.release, Now: at(now), Share: share})
				if err != nil {
					t.Fatal(err)
				}
				c.done = true
			}
			if c.done && now >= c.answer {
				p.call = nil
				if c.lost || c.release || p.dead {
					continue
				}
				p.tokens = apply(p.tokens, c.unspent, c.res)
				p.expiry, p.grant = c.sent+ttl, c.res.ID
			}
		}
		p := proxies[rng.IntN(len(proxies))]
		if p.dead || p.call != nil {
			continue
		}
		unspent := 0.0
		if now < p.expiry {
			unspent = p.tokens
		}
		p.tokens = unspent
		c := &call{sent: now, unspent: unspent}
		c.process = now + float64(rng.IntN(30000))/1e6
		c.answer = c.process + float64(rng.IntN(30000))/1e6
		r := rng.IntN(20)
		if quiet {
			r = 3 // renewals only
		}
		switch {
		case r == 0 && p.name != "hot":
			p.dead = true // killed holding its lease
			continue
		case r == 1: // an exact take of one token
			o := store.Run(ctx, []redisstore.Op{{Key: key, Rate: rate, Burst: burst, Cost: 1, Lease: true, TTL: ttl, LeaseShare: share, Now: at(now)}})[0]
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			if o.Allowed {
				spent = append(spent, now)
			}
			continue
		case r == 2 && unspent > 0: // release: nothing is spendable from now
			c.release = true
			p.tokens = 0
		default: // renew, sometimes losing the answer
			c.want = uint64(rng.IntN(15))
			if quiet {
				c.want = uint64(rng.IntN(3))
			}
			c.lost = rng.IntN(5) == 0
		}
		p.call = c
	}
	sort.Float64s(spent)
	worst := -burst
	for i := range spent {
		for j := i; j < len(spent); j++ {
			worst = max(worst, float64(j-i+1)-(burst+rate*(spent[j]-spent[i])))
		}
	}
	return worst, len(spent), now - t0
}

// TestLeaseServer sends lease requests as the filter does to
// tokengate-rls on a real Redis and reads the answer's Quota: requests is
// the new grant's whole amount (the reported tokens carried over plus the
// new ones), id the grant, and a report naming a grant that is gone
// carries nothing over.
func TestLeaseServer(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e := startServer(t, `{"rules":[{"name":"l","scope":"cluster","mode":"lease","lease_max":10,"lease_ttl_ms":2000,
		"limit_keys":["header:x"],"algorithm_config":{"rps":0.001,"burst":30}}],"settings":{"rls":{"cluster":"rls"}}}`, store)
	lease := func(grant, unspent, want string) (*rlsv3.RateLimitResponse_DescriptorStatus, *rlsv3.RateLimitResponse_Quota) {
		t.Helper()
		d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: rlscontract.RuleKey, Value: "l"}, {Key: rlscontract.CompositeKey, Value: "k"},
			{Key: rlscontract.ModeKey, Value: "lease"}, {Key: rlscontract.HolderKey, Value: "h1"},
			{Key: rlscontract.GrantKey, Value: grant}, {Key: rlscontract.UnspentKey, Value: unspent},
			{Key: rlscontract.WantKey, Value: want}}}
		resp := ask(t, e.client, "tokengate", d)
		if len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetQuota() == nil {
			t.Fatalf("answer %v: want one status with a quota", resp)
		}
		return resp.GetStatuses()[0], resp.GetStatuses()[0].GetQuota()
	}
	st, q := lease("0", "0", "8")
	if st.GetCode() != rlsv3.RateLimitResponse_OK || q.GetRequests() != 8 || q.GetId() == "" || st.GetLimitRemaining() != 22 {
		t.Fatalf("first lease: %v", st)
	}
	first := q.GetId()
	// 3 of the 8 left: the renewal carries them over and adds 5.
	if _, q = lease(first, "3", "5"); q.GetRequests() != 8 {
		t.Fatalf("renewal of 3 plus 5: quota %v, want 8 in all", q)
	}
	// The proxy never applies that answer (a timeout).
	// Reporting the first grant again (gone, carried into the lost one):
	// nothing is carried over, only the new tokens.
	if _, q = lease(first, "3", "2"); q.GetRequests() != 2 {
		t.Fatalf("renewal naming a replaced grant: quota %v, want the 2 new tokens only", q)
	}
}

// TestLeaseShares walks the lease script's shares (issue 22: lease mode
// starved proxies) at fixed instants: the refill is divided among the
// active holders, whoever asks first; a take gets only what no share
// keeps; a share stops at the cap, the rest going to whoever asks; a
// holder with no live grant keeps no share.
func TestLeaseShares(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	ctx := context.Background()
	const t0 = 1736940000.0
	key := redisstore.LeaseKey("r", "shares")
	op := func(holder string, grant uint64, want uint64, now float64) redisstore.LeaseResult {
		t.Helper()
		res, err := store.Lease(ctx, redisstore.LeaseOp{Key: key, Rate: 10, Burst: 20, TTL: 2, Holder: holder, Grant: grant,
			Want: want, Now: at(now), Share: 4})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	take := func(cost float64, now float64) redisstore.Outcome {
		t.Helper()
		o := store.Run(ctx, []redisstore.Op{{Key: key, Rate: 10, Burst: 20, Cost: cost, Lease: true, TTL: 2, LeaseShare: 4, Now: at(now)}})[0]
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		return o
	}
	check := func(step string, got, want redisstore.LeaseResult) {
		t.Helper()
		if got.OverLimit != want.OverLimit || got.Granted != want.Granted || got.Tokens != want.Tokens ||
			(want.Retry != 0 && got.Retry != want.Retry) {
			t.Fatalf("%s: got %+v, want %+v\n%v", step, got, want, srv.MustDo("HGETALL", key))
		}
	}
	// A full bucket: the burst is no one's share, first come.
	check("A", op("A", 0, 5, t0), redisstore.LeaseResult{Granted: 5, Tokens: 15})
	check("B", op("B", 0, 5, t0), redisstore.LeaseResult{Granted: 5, Tokens: 10})
	if o := take(10, t0); !o.Allowed {
		t.Fatalf("take of the 10 no share keeps: %+v", o)
	}
	// 0.4 s: 4 refilled, 2 for each holder. A asks first and gets its 2
	// only; B's 2 wait for B, whoever asks meanwhile.
	check("A asks first", op("A", 1, 10, t0+0.4), redisstore.LeaseResult{Granted: 2, Tokens: 0})
	check("A again", op("A", 3, 10, t0+0.4), redisstore.LeaseResult{OverLimit: true, Tokens: 0, Retry: 0.2})
	if o := take(1, t0+0.4); o.Allowed || o.Tokens != 0 {
		t.Fatalf("exact take from tokens kept for B: %+v", o)
	}
	check("B", op("B", 2, 10, t0+0.4), redisstore.LeaseResult{Granted: 2, Tokens: 0})
	// Both grants expire at t0+2.4: no holder is active from then on, the
	// refilled tokens are no one's, and a take gets them.
	if o := take(3, t0+3); !o.Allowed {
		t.Fatalf("exact take with no holder active: %+v", o)
	}
	// C alone: it gets what it asks for (10 of the 17 free); then, idle
	// for a second, its share stops at the cap (4) and the other 6 of the
	// refill are anyone's: a take gets 6, not 7.
	check("C alone", op("C", 0, 10, t0+3), redisstore.LeaseResult{Granted: 10, Tokens: 7})
	if o := take(7, t0+3); !o.Allowed {
		t.Fatalf("take of the 7 left: %+v", o)
	}
	if o := take(7, t0+4); o.Allowed || o.Tokens != 6 {
		t.Fatalf("take of 7 with C's share full: %+v, want refused with 6 free", o)
	}
	if o := take(6, t0+4); !o.Allowed {
		t.Fatalf("take of the 6 beyond C's share: %+v", o)
	}
}
