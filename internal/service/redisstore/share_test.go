package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

func shareStore(t *testing.T) (*redistest.Server, *redisstore.Store) {
	t.Helper()
	srv := redistest.Start(t)
	store, err := redisstore.New(redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	if err := eventually(func() error { return store.Ping(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	return srv, store
}

// shareState is a bucket's hash as share.lua writes it, recomputed from
// its records (g:, d:, q:) the way the running totals must sum them.
type shareState struct {
	tokens, last             float64
	totals                   []float64 // t, as written
	srate                    float64
	held, entries, holders   int
	waiters, waitWant, queue int
	wantCount, wantSum       int // the histogram w, summed
	histHolders, histSum     int // the holders' wants, from their records
	minExpiry                float64
}

func readShare(t *testing.T, srv *redistest.Server, key string) shareState {
	t.Helper()
	raw := srv.MustDo("HGETALL", key).([]any)
	f := map[string]string{}
	for i := 0; i+1 < len(raw); i += 2 {
		f[fmt.Sprint(raw[i])] = fmt.Sprint(raw[i+1])
	}
	var st shareState
	st.minExpiry = math.Inf(1)
	num := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("%q in %v: %v", s, f, err)
		}
		return v
	}
	b := strings.Split(f["b"], ":")
	st.tokens, st.last = num(b[0]), num(b[1])
	for _, v := range strings.Split(f["t"], ",") {
		st.totals = append(st.totals, num(v))
	}
	for _, bin := range strings.Split(f["w"], ",") {
		if bin == "" {
			continue
		}
		p := strings.Split(bin, ":")
		st.wantCount += int(num(p[1]))
		st.wantSum += int(num(p[2]))
	}
	for k, v := range f {
		switch {
		case strings.HasPrefix(k, "g:"):
			for i, e := range strings.Split(v, ";") {
				p := strings.Split(e, ",")
				st.srate += num(p[0]) / num(p[4])
				st.held += int(num(p[1]))
				st.entries++
				st.minExpiry = min(st.minExpiry, num(p[3]))
				if i == 0 && num(p[2]) > 0 {
					st.holders++
					d := strings.Split(f["d:"+k[2:]], ",")
					if len(d) != 4 {
						t.Fatalf("holder %s holds a share without a demand record: %v", k[2:], f)
					}
					st.histHolders++
					st.histSum += int(num(d[3]))
				}
			}
		case strings.HasPrefix(k, "d:"):
			p := strings.Split(v, ",")
			st.minExpiry = min(st.minExpiry, num(p[1]))
			if tk := p[2]; tk != "0" {
				st.waiters++
				st.waitWant += int(num(p[3]))
				if f["q:"+tk] != k[2:] {
					t.Fatalf("holder %s waits with ticket %s, but q:%s is %q", k[2:], tk, tk, f["q:"+tk])
				}
			}
		case strings.HasPrefix(k, "q:"):
			st.queue++
		}
	}
	return st
}

// TestShareTotals drives share.lua with 60 holders at random on simulated
// time (demands, releases, holders that stop reporting and expire) and
// checks after every call that the running totals it keeps equal the sums
// over its records: the live shares' rates and max_tokens, the holders
// holding one (and the histogram of their wants), the waiting ones and
// their wants; that no record outlives its expiry; and the bound's
// invariants (free tokens + max_tokens <= burst, rates <= the pool).
func TestShareTotals(t *testing.T) {
	srv, store := shareStore(t)
	key := redisstore.ShareKey("r", "totals")
	const rate, burst, fill, pool, bpool = 10.0, 12.0, 100, 950, 9
	rng := rand.New(rand.NewSource(30))
	now := 1000.0
	active := map[int]bool{}
	for step := range 400 {
		now += rng.Float64() * 1.5
		b := redisstore.ShareBatch{Key: key, Rate: rate, Burst: burst, Fill: fill, Pool: pool, BurstPool: bpool,
			Grace: 1, Turn: 5, Now: strconv.FormatFloat(now, 'f', 6, 64)}
		seen := map[int]bool{}
		for range 1 + rng.Intn(12) {
			h := rng.Intn(60)
			if seen[h] {
				continue
			}
			seen[h] = true
			op := redisstore.ShareOp{Holder: "h" + strconv.Itoa(h), Demand: []float64{0, 0.4, 1, 3, 8}[rng.Intn(5)], TTL: []float64{3, 11}[rng.Intn(2)]}
			if active[h] && rng.Intn(10) == 0 {
				op.Release = true
				delete(active, h)
			} else {
				active[h] = true
			}
			b.Ops = append(b.Ops, op)
		}
		res := store.Share(context.Background(), []redisstore.ShareBatch{b})[0]
		for _, r := range res {
			if r.Err != nil {
				t.Fatalf("step %d: %v", step, r.Err)
			}
		}
		st := readShare(t, srv, key)
		want := []float64{st.srate, float64(st.held), float64(st.entries), float64(st.holders), float64(st.waiters), float64(st.waitWant)}
		for i, name := range []string{"rates", "max_tokens", "entries", "holders", "waiters", "waiting wants"} {
			if math.Abs(st.totals[i]-want[i]) > 1e-6 {
				t.Fatalf("step %d at %.6f: total %s %v, records sum to %v", step, now, name, st.totals[i], want[i])
			}
		}
		if st.queue != st.waiters {
			t.Fatalf("step %d: %d q: tickets for %d waiting holders", step, st.queue, st.waiters)
		}
		if st.wantCount != st.histHolders || st.wantSum != st.histSum {
			t.Fatalf("step %d: histogram %d wants summing %d, holders' records %d summing %d", step, st.wantCount, st.wantSum, st.histHolders, st.histSum)
		}
		if st.minExpiry <= now {
			t.Fatalf("step %d at %.6f: a record expiring at %.6f is still there", step, now, st.minExpiry)
		}
		if st.tokens+float64(st.held) > burst+1e-6 {
			t.Fatalf("step %d: free tokens %.6f + max_tokens %d above the burst %v", step, st.tokens, st.held, burst)
		}
		if st.srate > pool/float64(fill)+1e-6 {
			t.Fatalf("step %d: shares' rates %.6f above the pool %v/s", step, st.srate, pool/float64(fill))
		}
	}
	// Every holder gone: after the longest TTL and the grace, the totals
	// are empty again and only the free tokens remain.
	now += 20
	store.Share(context.Background(), []redisstore.ShareBatch{{Key: key, Rate: rate, Burst: burst, Fill: fill, Pool: pool, BurstPool: bpool,
		Grace: 1, Turn: 5, Now: strconv.FormatFloat(now, 'f', 6, 64)}})
	if st := readShare(t, srv, key); st.entries != 0 || st.totals[0] != 0 || st.totals[1] != 0 || st.totals[3] != 0 || st.totals[4] != 0 || st.tokens != burst {
		t.Fatalf("all expired: %+v; want no share, no holder, no waiter and a full bucket", st)
	}
	// No call read every holder (the rebuild is the only HGETALL; the
	// test's own reads are the rest).
	stats := fmt.Sprint(srv.MustDo("INFO", "commandstats"))
	if reads := 400 + 1; !strings.Contains(stats, fmt.Sprintf("cmdstat_hgetall:calls=%d,", reads)) {
		t.Errorf("HGETALL calls: %s; want only the test's %d", stats, reads)
	}
}

// TestShareRebuild: a bucket written by the previous share.lua (no
// running totals) is rebuilt from its records once: its holder's share
// still counts, so a new holder beside a full pool gets nothing and the
// free tokens are untouched (no refill across the rebuild).
func TestShareRebuild(t *testing.T) {
	srv, store := shareStore(t)
	key := redisstore.ShareKey("r", "old")
	srv.MustDo("HSET", key, "b", "50.000000:1000.000000",
		"g:a", "9.000000,50,1011.000000,1012.000000,1,1000.000000",
		"d:a", "10.000000,1012.000000,0")
	res := store.Share(context.Background(), []redisstore.ShareBatch{{Key: key, Rate: 10, Burst: 100, Fill: 1, Pool: 9, BurstPool: 50,
		Grace: 1, Turn: 10, Now: "1001.000000", Ops: []redisstore.ShareOp{{Holder: "b", Demand: 10, TTL: 11}}}})[0][0]
	if res.Err != nil || res.Units != 0 || math.Abs(res.Tokens-50) > 1e-6 {
		t.Fatalf("b beside a's old full share: %+v; want no share and 50 free tokens", res)
	}
	st := readShare(t, srv, key)
	if st.totals[0] != 9 || st.totals[1] != 50 || st.totals[3] != 1 || st.totals[4] != 1 {
		t.Fatalf("rebuilt totals %v; want a's 9/s and 50 max_tokens, one holder, b waiting", st.totals)
	}
}

// TestShareClockBack: a share granted after the clock went back (Redis
// TIME after a failover to a node whose clock is behind) expires at an
// instant whose slot was already processed; it is listed at the next slot
// instead (held a little longer), so it still leaves the totals, and
// once every share has expired the bucket holds none.
func TestShareClockBack(t *testing.T) {
	srv, store := shareStore(t)
	key := redisstore.ShareKey("r", "back")
	at := func(now string, holder string) {
		t.Helper()
		b := redisstore.ShareBatch{Key: key, Rate: 10, Burst: 100, Fill: 1, Pool: 9, BurstPool: 50, Grace: 1, Turn: 10, Now: now}
		if holder != "" {
			b.Ops = []redisstore.ShareOp{{Holder: holder, Demand: 1, TTL: 3}}
		}
		if r := store.Share(context.Background(), []redisstore.ShareBatch{b})[0]; len(r) > 0 && (r[0].Err != nil || r[0].Units == 0) {
			t.Fatalf("%s at %s: %+v, want a share", holder, now, r[0])
		}
	}
	at("1000.000000", "a")
	at("995.000000", "b") // b's share expires at 999, before 1000
	at("1001.000000", "")
	at("1010.000000", "")
	if st := readShare(t, srv, key); st.entries != 0 || st.totals[2] != 0 || st.totals[3] != 0 {
		t.Fatalf("every share expired: %d entries left, totals %v; want none", st.entries, st.totals)
	}
}

// TestShareOneToken: five Envoys of one request a second on a rule of
// 4/s and burst 6 (fill 60 s: 60 units are 1/s; pool 228, four places),
// reporting each second in turn. Each one-token share covers its demand
// (61 units), the fourth takes the rest of the pool on two tokens (45,
// which a one-token bucket would turn into one request in two), the fifth
// waits; the shares are renewed unchanged (the fourth is not cut to one
// token though the free tokens cannot pay two again); the first yields
// when its turn (7 s) is over, and the fifth takes its place as its grace
// ends.
func TestShareOneToken(t *testing.T) {
	_, store := shareStore(t)
	key := redisstore.ShareKey("r", "one")
	type share struct{ units, max uint64 }
	full, rest, none := share{61, 1}, share{45, 2}, share{0, 0}
	tests := []struct {
		at   int
		want [5]share
	}{
		{1000, [5]share{full, full, full, rest, none}},
		{1001, [5]share{full, full, full, rest, none}},
		{1006, [5]share{full, full, full, rest, none}},
		{1007, [5]share{none, full, full, rest, none}},
		{1008, [5]share{none, full, full, rest, full}},
	}
	now := 1000
	for _, tc := range tests {
		var got [5]share
		for ; now <= tc.at; now++ {
			for h := range 5 {
				b := redisstore.ShareBatch{Key: key, Rate: 4, Burst: 6, Fill: 60, Pool: 228, BurstPool: 4, Grace: 1, Turn: 7,
					Now: strconv.Itoa(now) + ".000000", Ops: []redisstore.ShareOp{{Holder: "h" + strconv.Itoa(h), Demand: 1, TTL: 3}}}
				r := store.Share(context.Background(), []redisstore.ShareBatch{b})[0][0]
				if r.Err != nil {
					t.Fatalf("h%d at %d: %v", h, now, r.Err)
				}
				if now > 1000 && now < 1007 && h < 4 && r.Changed {
					t.Errorf("h%d at %d: share changed to %+v; want it renewed", h, now, r)
				}
				got[h] = share{r.Units, r.MaxTokens}
			}
		}
		if got != tc.want {
			t.Errorf("at %d: shares %v; want %v", tc.at, got, tc.want)
		}
	}
}
