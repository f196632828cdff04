package rls_test

import (
	"context"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/redistest"
	"github.com/tokengate/tokengate/internal/rls"
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
	key := rls.LeaseKey("r", "k")
	op := func(holder string, grant uint64, unspent float64, want uint64, release bool, now float64) rls.LeaseResult {
		t.Helper()
		res, err := store.Lease(ctx, rls.LeaseOp{Key: key, Rate: 10, Burst: 20, TTL: 2, Holder: holder, Grant: grant,
			Unspent: unspent, Want: want, Release: release, Now: at(now)})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	take := func(cost float64, now float64) rls.Outcome {
		t.Helper()
		o := store.Run(ctx, []rls.Op{{Key: key, Rate: 10, Burst: 20, Cost: cost, Lease: true, TTL: 2, Now: at(now)}})[0]
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		return o
	}

	steps := []struct {
		name string
		do   func() rls.LeaseResult
		want rls.LeaseResult // Retry and ValidUntil compared only when set
	}{
		{"A gets what it wants", func() rls.LeaseResult { return op("A", 0, 0, 8, false, t0) }, rls.LeaseResult{Granted: 8, ID: 1, Tokens: 12}},
		{"B too", func() rls.LeaseResult { return op("B", 0, 0, 8, false, t0) }, rls.LeaseResult{Granted: 8, ID: 2, Tokens: 4}},
		{"C gets the rest", func() rls.LeaseResult { return op("C", 0, 0, 8, false, t0) }, rls.LeaseResult{Granted: 4, ID: 3, Tokens: 0}},
		{"D finds none", func() rls.LeaseResult { return op("D", 0, 0, 8, false, t0) }, rls.LeaseResult{OverLimit: true, ID: 4, Tokens: 0, Retry: 0.1}},
		// 1 s later the refill would give 10, but 20 are held: L + H <= burst.
		{"held tokens cap the refill", func() rls.LeaseResult { return op("D", 4, 0, 8, false, t0+1) }, rls.LeaseResult{OverLimit: true, ID: 5, Tokens: 0}},
		// A reports 3 of its 8 unspent: 5 were spent, H falls to 15, and
		// that room fills at the rate from this call on.
		{"A reports 3 unspent", func() rls.LeaseResult { return op("A", 1, 3, 0, false, t0+1) }, rls.LeaseResult{ID: 6, Tokens: 0}},
		{"the freed room refills", func() rls.LeaseResult { return op("D", 5, 0, 8, false, t0+1.5) }, rls.LeaseResult{Granted: 5, ID: 7, Tokens: 0}},
		// B returns 6 of grant 2: they go back to L.
		{"B releases 6", func() rls.LeaseResult { return op("B", 2, 6, 0, true, t0+1.5) }, rls.LeaseResult{Granted: 6, Tokens: 6}},
		// A stale report (grant 1 is gone): nothing it claims is covered.
		{"stale report covers nothing", func() rls.LeaseResult { return op("A", 1, 8, 0, true, t0+1.5) }, rls.LeaseResult{Granted: 0, Tokens: 6}},
		// C's grant expired at t0+2: its capacity comes back, not its
		// tokens, from this call on (the refill up to it still sees C's 4
		// held beside A's 3 and D's 5: L = min(20-12, 6+10)).
		{"expiry frees capacity", func() rls.LeaseResult { return op("E", 0, 0, 20, false, t0+2.5) }, rls.LeaseResult{Granted: 8, ID: 8, Tokens: 0}},
	}
	for i, s := range steps {
		got := s.do()
		w := s.want
		if got.OverLimit != w.OverLimit || got.Granted != w.Granted || (w.ID != 0 && got.ID != w.ID) || got.Tokens != w.Tokens ||
			(w.Retry != 0 && got.Retry != w.Retry) {
			t.Fatalf("step %d (%s): got %+v, want %+v\n%v", i, s.name, got, w, srv.MustDo("HGETALL", key))
		}
	}
	// An exact take sees the same bucket: nothing is free.
	if o := take(1, t0+2.5); o.Allowed {
		t.Fatalf("exact take from an empty bucket allowed: %+v", o)
	}
	// 0.25 s later: 2.5 tokens (under the cap 20 - 16), one taken.
	if o := take(1, t0+2.75); !o.Allowed || o.Tokens != 1.5 {
		t.Fatalf("exact take after 0.25 s: %+v, want allowed with 1.5 left", o)
	}
	// The key lives until every grant has expired and the bucket is full.
	if pttl := srv.MustDo("PTTL", key).(int64); pttl < 2000 || pttl > 4000 {
		t.Fatalf("PTTL %d ms", pttl)
	}
	// NOSCRIPT is answered by EVAL.
	srv.MustDo("SCRIPT", "FLUSH")
	if got := op("F", 0, 0, 1, false, t0+10); got.Granted != 1 {
		t.Fatalf("after SCRIPT FLUSH: %+v", got)
	}
}

// TestLeaseBound simulates proxies that lease, renew, spend, release, lose
// answers and die, against the real script at fixed instants, and checks
// the accuracy bound of docs/lease.md on every window: the tokens spent in
// [t1, t2] never exceed burst + rate x (t2 - t1).
func TestLeaseBound(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	ctx := context.Background()
	const rate, burst, ttl = 50.0, 40.0, 0.5
	type proxy struct {
		name    string
		tokens  float64
		expiry  float64
		grant   uint64
		dead    bool
		spendAt float64 // spending speed, tokens per second
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 3 {
		key := rls.LeaseKey("bound", strconv.Itoa(round))
		proxies := []*proxy{{name: "hot", spendAt: 200}, {name: "b", spendAt: 20}, {name: "c", spendAt: 5}}
		var spent []float64 // one entry per token spent: its time
		now := 1736940000.0
		for step := 0; step < 1500; step++ {
			dt := float64(rng.IntN(60000)) / 1e6
			// Spending happens over (now, now+dt]: whole tokens, before
			// the allowance's expiry.
			for _, p := range proxies {
				if p.dead {
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
			p := proxies[rng.IntN(len(proxies))]
			if p.dead {
				continue
			}
			unspent := 0.0
			if now < p.expiry {
				unspent = p.tokens
			}
			switch r := rng.IntN(20); {
			case r == 0 && p.name != "hot":
				p.dead = true // killed holding its lease
			case r == 1: // an exact take of one token
				o := store.Run(ctx, []rls.Op{{Key: key, Rate: rate, Burst: burst, Cost: 1, Lease: true, TTL: ttl, Now: at(now)}})[0]
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				if o.Allowed {
					spent = append(spent, now)
				}
			case r == 2 && unspent > 0: // release
				p.tokens = 0
				if _, err := store.Lease(ctx, rls.LeaseOp{Key: key, Rate: rate, Burst: burst, TTL: ttl, Holder: p.name,
					Grant: p.grant, Unspent: unspent, Release: true, Now: at(now)}); err != nil {
					t.Fatal(err)
				}
			default: // renew, sometimes losing the answer
				want := uint64(rng.IntN(15))
				res, err := store.Lease(ctx, rls.LeaseOp{Key: key, Rate: rate, Burst: burst, TTL: ttl, Holder: p.name,
					Grant: p.grant, Unspent: unspent, Want: want, Now: at(now)})
				if err != nil {
					t.Fatal(err)
				}
				if rng.IntN(8) == 0 {
					continue // the answer is lost
				}
				p.tokens = min(p.tokens, unspent) + float64(res.Granted)
				p.expiry, p.grant = now+ttl, res.ID
			}
		}
		sort.Float64s(spent)
		worst := 0.0
		for i := range spent {
			for j := i; j < len(spent); j++ {
				over := float64(j-i+1) - (burst + rate*(spent[j]-spent[i]))
				if over > worst {
					worst = over
				}
			}
		}
		if worst > 1e-6 {
			t.Errorf("round %d: %d tokens spent; a window exceeded burst + rate x T by %.3f", round, len(spent), worst)
		}
		if len(spent) < 1000 {
			t.Errorf("round %d: only %d tokens spent: the simulation did not load the bucket", round, len(spent))
		}
		t.Logf("round %d: %d tokens spent over %.1f s (limit allows %.0f)", round, len(spent), now-1736940000, burst+rate*(now-1736940000))
	}
}
