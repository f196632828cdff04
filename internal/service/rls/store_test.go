package rls_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/sharedstate"
)

// newStore connects a Store to addrs and waits until it answers PING.
func newStore(t testing.TB, addrs []string, cluster bool, timeout time.Duration) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(redisstore.Options{Addrs: addrs, Cluster: cluster, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.Ping(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("store on %v: no PING answer within 10 s: %v", addrs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// TestScriptMatchesBucket runs the Lua script and bucket.Limit side by side
// on the same instants and costs: same decisions, and the stored value is
// exactly what sharedstate's codec writes for bucket's state.
func TestScriptMatchesBucket(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	rng := rand.New(rand.NewPCG(1, 2))
	limits := []bucket.Limit{
		{Rate: 5, Burst: 10},
		{Rate: 0.3, Burst: 2.5},
		{Rate: 1000, Burst: 1000},
		{Rate: 1e-3, Burst: 7},
		{Rate: 123.456, Burst: 987.654},
	}
	for li, l := range limits {
		key := fmt.Sprintf("tb:{match:%d}", li)
		micros := int64(1736940000) * 1e6
		var st bucket.State
		fresh := true
		for step := range 400 {
			// Steps of 0 to 2 s, sometimes backwards (clock skew), costs
			// from 0.5 to burst+1, a refund now and then.
			switch rng.IntN(10) {
			case 0:
				micros -= rng.Int64N(1500000)
			default:
				micros += rng.Int64N(2000000)
			}
			now := sharedstate.Quantize(float64(micros) / 1e6)
			nowStr := strconv.FormatFloat(now, 'f', 6, 64)
			cost := float64(1 + rng.IntN(int(l.Burst)+1))
			if rng.IntN(4) == 0 {
				cost = float64(rng.IntN(3)) + 0.5
			}
			refund := rng.IntN(8) == 0
			if fresh {
				st = l.Full(now)
			}
			var want bucket.State
			wantAllowed := true
			var wantTokens float64
			if refund {
				want = l.Refund(st, now, cost)
				wantTokens = want.Tokens
			} else {
				var res bucket.Result
				want, res = l.Take(st, now, cost)
				wantAllowed, wantTokens = res.Allowed, res.Tokens
			}
			opCost := cost
			if refund {
				opCost = -cost
			}
			got := store.Run(context.Background(), []redisstore.Op{{Key: key, Rate: l.Rate, Burst: l.Burst, Cost: opCost, Now: nowStr}})[0]
			if got.Err != nil {
				t.Fatalf("limit %d step %d: %v", li, step, got.Err)
			}
			if got.Allowed != wantAllowed {
				t.Fatalf("limit %d step %d (now %s cost %v refund %v, state %+v): allowed %v, want %v",
					li, step, nowStr, cost, refund, st, got.Allowed, wantAllowed)
			}
			wantStored := string(sharedstate.AppendState(nil, bucket.State{Tokens: wantTokens, Last: want.Last}))
			if gotTok := strconv.FormatFloat(got.Tokens, 'f', 6, 64); gotTok+wantStored[len(gotTok):] != wantStored || wantStored[len(gotTok)] != ':' {
				t.Fatalf("limit %d step %d: tokens %s, want the state %s", li, step, gotTok, wantStored)
			}
			v, _ := srv.Do("GET", key)
			if wantAllowed {
				if v != wantStored {
					t.Fatalf("limit %d step %d: stored %v, want %s", li, step, v, wantStored)
				}
				// What the filter would read back.
				st, _ = sharedstate.ParseState([]byte(wantStored))
				fresh = false
			} else if !fresh && v == nil {
				t.Fatalf("limit %d step %d: a rejection removed the key", li, step)
			}
		}
	}
}

func TestScriptTTL(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	// 4 tokens taken at 2 a second: full again in 2 s, the TTL is that
	// plus 1 s.
	out := store.Run(context.Background(), []redisstore.Op{{Key: "tb:{ttl:a}", Rate: 2, Burst: 10, Cost: 4}})
	if out[0].Err != nil || !out[0].Allowed || out[0].Tokens != 6 {
		t.Fatalf("take: %+v", out[0])
	}
	pttl := srv.MustDo("PTTL", "tb:{ttl:a}").(int64)
	if pttl <= 2000 || pttl > 3000 {
		t.Fatalf("PTTL %d ms, want in (2000, 3000]", pttl)
	}
	// A rejected request writes nothing: no key for a cost above burst.
	out = store.Run(context.Background(), []redisstore.Op{{Key: "tb:{ttl:b}", Rate: 2, Burst: 10, Cost: 11}})
	if out[0].Err != nil || out[0].Allowed {
		t.Fatalf("cost above burst: %+v", out[0])
	}
	if v := srv.MustDo("EXISTS", "tb:{ttl:b}"); v != int64(0) {
		t.Fatalf("a rejection created the key: EXISTS %v", v)
	}
	// NOSCRIPT (SCRIPT FLUSH, as after a restart) is answered by EVAL.
	srv.MustDo("SCRIPT", "FLUSH")
	out = store.Run(context.Background(), []redisstore.Op{{Key: "tb:{ttl:a}", Rate: 2, Burst: 10, Cost: 1}})
	if out[0].Err != nil || !out[0].Allowed {
		t.Fatalf("after SCRIPT FLUSH: %+v", out[0])
	}
}

// TestMemoryPerKey states what one active bucket costs Redis: MEMORY USAGE
// of a per-IP key (IPv4, and the longest IPv6 text). docs/rls.md quotes
// the figures; the bound catches a format that grows.
func TestMemoryPerKey(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	for _, ip := range []string{"203.0.113.7", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"} {
		key := redisstore.BucketKey("per-ip", ip)
		if out := store.Run(context.Background(), []redisstore.Op{{Key: key, Rate: 0.001, Burst: 20, Cost: 1}}); out[0].Err != nil {
			t.Fatal(out[0].Err)
		}
		n := srv.MustDo("MEMORY", "USAGE", key).(int64)
		t.Logf("MEMORY USAGE %s = %d bytes (value %v)", key, n, srv.MustDo("GET", key))
		if n > 200 {
			t.Errorf("%s takes %d bytes, want at most 200", key, n)
		}
	}
}

// TestScriptRedisTime: with the time from Redis TIME (no Op.Now), the
// stored value is what sharedstate writes for the state it holds (its
// text survives a parse and a write), its refill time lies between TIME
// before and after the call, and a refill time ahead of the clock (within
// the skew, kept) is written the same way.
func TestScriptRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	redisNow := func() float64 {
		v := srv.MustDo("TIME").([]any)
		sec, _ := strconv.ParseFloat(v[0].(string), 64)
		us, _ := strconv.ParseFloat(v[1].(string), 64)
		return sec + us/1e6
	}
	canonical := func(key string) bucket.State {
		t.Helper()
		v, _ := srv.Do("GET", key)
		s, ok := v.(string)
		if !ok {
			t.Fatalf("%s: GET %v", key, v)
		}
		st, err := sharedstate.ParseState([]byte(s))
		if err != nil {
			t.Fatalf("%s: %q: %v", key, s, err)
		}
		if back := string(sharedstate.AppendState(nil, st)); back != s {
			t.Fatalf("%s: stored %q, sharedstate writes %q for its state", key, s, back)
		}
		return st
	}
	// Until calls have met microseconds of fewer than 6 and fewer than 5
	// digits (the first 100 ms and 10 ms of a second), at most 60 s: a
	// bound for a broken clock, not a speed (on a loaded machine each call
	// takes longer, and a call lands in a second's first 10 ms only about
	// once in a hundred).
	var under100ms, under10ms int
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; under100ms < 3 || under10ms < 1; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls in 60 s, %d in a second's first 100 ms and %d in its first 10 ms", i, under100ms, under10ms)
		}
		key := fmt.Sprintf("tb:{time:%d}", i%7)
		before := redisNow()
		out := store.Run(context.Background(), []redisstore.Op{{Key: key, Rate: 0.5, Burst: 1e6, Cost: 1}})[0]
		after := redisNow()
		if out.Err != nil || !out.Allowed {
			t.Fatalf("call %d: %+v", i, out)
		}
		st := canonical(key)
		if st.Last < before-1e-6 || st.Last > after+1e-6 {
			t.Fatalf("call %d: refill time %.6f not within TIME %.6f..%.6f", i, st.Last, before, after)
		}
		if frac := st.Last - math.Floor(st.Last); frac < 0.1 {
			under100ms++
			if frac < 0.01 {
				under10ms++
			}
		}
	}
	// A refill time half a second ahead of Redis's clock stays.
	ahead := sharedstate.Quantize(redisNow() + 0.5)
	srv.MustDo("SET", "tb:{time:ahead}", string(sharedstate.AppendState(nil, bucket.State{Tokens: 10, Last: ahead})))
	if out := store.Run(context.Background(), []redisstore.Op{{Key: "tb:{time:ahead}", Rate: 0.5, Burst: 1e6, Cost: 1}})[0]; out.Err != nil || !out.Allowed {
		t.Fatalf("ahead: %+v", out)
	}
	if st := canonical("tb:{time:ahead}"); st.Last != ahead || st.Tokens != 9 {
		t.Fatalf("ahead: state %+v, want 9 tokens at %.6f", st, ahead)
	}
}
