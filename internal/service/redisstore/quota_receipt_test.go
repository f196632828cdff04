package redisstore_test

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// TestQuotaReceiptScripts: what quota.lua does with a stream's receipt,
// on a real Redis. A take adds what it took (a rejected take nothing), a
// refund of this call's take (the all-or-nothing refund) takes it off, a
// settlement's refund gives back at most the receipt and takes off what it
// gave back, a charge adds, a reset gives back what the receipt holds (not
// the period's whole consumption) and deletes it; refunds and resets with
// a receipt no take wrote give nothing back; a refund into another
// period finds no receipt there; without a receipt key the script is as
// before.
func TestQuotaReceiptScripts(t *testing.T) {
	srv := redistest.Start(t)
	store := readyStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	ctx := context.Background()
	const start, next = 1777507200, 1780185600
	qk := redisstore.QuotaKey("llm", "k", start)
	ov := redisstore.OverrideKey("llm", "k")
	rk := redisstore.ReceiptKey(qk, "0123456789abcdef")
	if rk != "qt:{llm:k}:1777507200:r:0123456789abcdef" {
		t.Fatalf("receipt key %q", rk)
	}
	other := redisstore.ReceiptKey(qk, "fedcba9876543210") // another stream of the same key
	quota := func() *redisstore.QuotaOp {
		return &redisstore.QuotaOp{Override: ov, Limit: 1000, TTL: 3600, Thresholds: []float64{0.5}}
	}
	take := func(cost float64, receipt string) redisstore.Outcome {
		t.Helper()
		o := store.Run(ctx, []redisstore.Op{{Key: qk, Cost: cost, Quota: quota(), Receipt: receipt}})[0]
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		return o
	}
	settleAt := func(key string, kind rlscontract.SettleKind, amount float64, receipt string) redisstore.Outcome {
		t.Helper()
		o := store.Settle(ctx, []redisstore.SettleOp{{Key: key, Burst: 1000, Kind: kind, Amount: amount, Quota: quota(), Receipt: receipt}})[0]
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		return o
	}
	settle := func(kind rlscontract.SettleKind, amount float64, receipt string) redisstore.Outcome {
		t.Helper()
		return settleAt(qk, kind, amount, receipt)
	}
	get := func(key string) string {
		v, _ := srv.Do("GET", key)
		if v == nil {
			return "none"
		}
		return v.(string)
	}
	steps := []struct {
		name           string
		do             func() redisstore.Outcome
		used           float64
		cut            bool
		receipt, other string
	}{
		{"take 30", func() redisstore.Outcome { return take(30, rk) }, 30, false, "30", "none"},
		{"take 25", func() redisstore.Outcome { return take(25, rk) }, 55, false, "55", "none"},
		{"a rejected take of 2000", func() redisstore.Outcome { return take(2000, rk) }, 55, false, "55", "none"},
		{"this call's refund of 25", func() redisstore.Outcome { return take(-25, rk) }, 30, false, "30", "none"},
		{"another stream takes 400", func() redisstore.Outcome { return take(400, other) }, 430, false, "30", "400"},
		{"refund 10", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 10, rk) }, 420, false, "20", "400"},
		{"charge 15", func() redisstore.Outcome { return settle(rlscontract.SettleCharge, 15, rk) }, 435, false, "35", "400"},
		{"refund 1000: the receipt's 35", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 1000, rk) }, 400, true, "none", "400"},
		{"refund 10 again: nothing left", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 10, rk) }, 400, true, "none", "400"},
		{"refund with a receipt no take wrote", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 10, rk+"x") }, 400, true, "none", "400"},
		{"reset with a receipt no take wrote", func() redisstore.Outcome { return settle(rlscontract.SettleReset, 0, rk+"x") }, 400, true, "none", "400"},
		{"take 70", func() redisstore.Outcome { return take(70, rk) }, 470, false, "70", "400"},
		{"reset with the receipt: its 70 only", func() redisstore.Outcome { return settle(rlscontract.SettleReset, 0, rk) }, 400, false, "none", "400"},
		{"a charge of 60 in the next period, without a receipt", func() redisstore.Outcome {
			return settleAt(redisstore.QuotaKey("llm", "k", next), rlscontract.SettleCharge, 60, "")
		}, 60, false, "none", "400"},
		{"the other stream's refund lands in the next period: nothing", func() redisstore.Outcome {
			return settleAt(redisstore.QuotaKey("llm", "k", next), rlscontract.SettleRefund, 400, redisstore.ReceiptKey(redisstore.QuotaKey("llm", "k", next), "fedcba9876543210"))
		}, 60, true, "none", "400"},
		{"the other stream's reset lands in the next period: nothing", func() redisstore.Outcome {
			return settleAt(redisstore.QuotaKey("llm", "k", next), rlscontract.SettleReset, 0, redisstore.ReceiptKey(redisstore.QuotaKey("llm", "k", next), "fedcba9876543210"))
		}, 60, true, "none", "400"},
		{"a refund without a receipt key: bounded by zero only", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 50, "") }, 350, false, "none", "400"},
	}
	for _, st := range steps {
		o := st.do()
		if o.Quota == nil || o.Quota.Used != st.used || o.Cut != st.cut || get(rk) != st.receipt || get(other) != st.other {
			t.Fatalf("%s: %+v (quota %+v), receipts %s %s, want used %v cut %v receipts %s %s", st.name, o, o.Quota, get(rk), get(other), st.used, st.cut, st.receipt, st.other)
		}
	}
	if u, _ := srv.Do("HGET", qk, "u"); u != "350" {
		t.Errorf("the period's consumption: %v, want 350", u)
	}
	if pttl, _ := srv.Do("PTTL", other); pttl.(int64) <= 0 || pttl.(int64) > 900000 {
		t.Errorf("the receipt's TTL: %v ms, want up to 15 minutes", pttl)
	}
	// The all-or-nothing refund of a take leaves no receipt; a take
	// without a receipt writes none.
	k2 := redisstore.QuotaKey("llm", "j", start)
	r2 := redisstore.ReceiptKey(k2, "0123456789abcdef")
	for _, cost := range []float64{5, -5} {
		if o := store.Run(ctx, []redisstore.Op{{Key: k2, Cost: cost, Quota: quota(), Receipt: r2}})[0]; o.Err != nil {
			t.Fatal(o.Err)
		}
	}
	store.Run(ctx, []redisstore.Op{{Key: k2, Cost: 1, Quota: quota()}})
	if keys, _ := srv.Do("KEYS", "qt:{llm:j}*"); len(keys.([]any)) != 1 || keys.([]any)[0] != k2 {
		t.Errorf("keys %v, want the consumption alone", keys)
	}
	// A reset without a receipt key deletes the period (the arithmetic,
	// as before).
	if o := store.Settle(ctx, []redisstore.SettleOp{{Key: k2, Kind: rlscontract.SettleReset, Quota: quota()}})[0]; o.Err != nil || o.Cut {
		t.Fatalf("reset without a receipt key: %+v", o)
	}
	if n, _ := srv.Do("EXISTS", k2); n != int64(0) {
		t.Errorf("after a reset without a receipt key: EXISTS %v, want 0", n)
	}
}

// BenchmarkQuotaTakeReceipt: one quota take of a rule that settles,
// without and with a new receipt (as each stream's admission), sent 64 to
// a pipeline from one caller; redis-µs/take is Redis's own time per
// EVALSHA (INFO commandstats), the cost of the receipt's write.
func BenchmarkQuotaTakeReceipt(b *testing.B) {
	srv := redistest.Start(b)
	store := readyStore(b, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	ctx := context.Background()
	for _, receipt := range []bool{false, true} {
		b.Run("receipt="+strconv.FormatBool(receipt), func(b *testing.B) {
			if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
				b.Fatal(err)
			}
			ops := make([]redisstore.Op, 64)
			n := 0
			for b.Loop() {
				for i := range ops {
					n++
					k := strconv.Itoa(n % 10000)
					key := redisstore.QuotaKey("llm", k, 1777507200)
					ops[i] = redisstore.Op{Key: key, Cost: 1, Quota: &redisstore.QuotaOp{Override: redisstore.OverrideKey("llm", k), Limit: 1e15, TTL: 3600}}
					if receipt {
						ops[i].Receipt = redisstore.ReceiptKey(key, strconv.FormatInt(int64(n)|1<<60, 16))
					}
				}
				for _, o := range store.Run(ctx, ops) {
					if o.Err != nil || !o.Allowed {
						b.Fatalf("%+v", o)
					}
				}
			}
			b.StopTimer()
			v, err := srv.Do("INFO", "commandstats")
			if err != nil {
				b.Fatal(err)
			}
			m := regexp.MustCompile(`cmdstat_evalsha:calls=\d+,usec=\d+,usec_per_call=([0-9.]+)`).FindStringSubmatch(v.(string))
			if m == nil {
				b.Fatal("no evalsha in INFO commandstats")
			}
			us, _ := strconv.ParseFloat(m[1], 64)
			b.ReportMetric(us, "redis-µs/take")
			b.ReportMetric(float64(b.N*len(ops))/b.Elapsed().Seconds(), "takes/s")
		})
	}
}

// TestQuotaReceiptCluster: on a Redis Cluster of three masters, quota
// takes and settlements with their receipts (three keys of one hash tag:
// the consumption, the override, the receipt) run in one pipeline on
// whichever master holds each key, and the receipt bounds the refund
// there as on one node.
func TestQuotaReceiptCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	store := readyStore(t, redisstore.Options{Addrs: c.Addrs(), Cluster: true, Timeout: 2 * time.Second})
	ctx := context.Background()
	var takes []redisstore.Op
	var refunds []redisstore.SettleOp
	nodes := map[int]bool{}
	for i := range 12 {
		k := "k" + strconv.Itoa(i)
		key := redisstore.QuotaKey("llm", k, 1777507200)
		nodes[c.NodeFor(key)] = true
		rk := redisstore.ReceiptKey(key, "0123456789abcdef")
		q := &redisstore.QuotaOp{Override: redisstore.OverrideKey("llm", k), Limit: 1000, TTL: 3600}
		takes = append(takes, redisstore.Op{Key: key, Cost: 40, Quota: q, Receipt: rk})
		refunds = append(refunds, redisstore.SettleOp{Key: key, Burst: 1000, Kind: rlscontract.SettleRefund, Amount: 100, Quota: q, Receipt: rk})
	}
	if len(nodes) < 2 {
		t.Fatalf("the keys fell on %d master(s)", len(nodes))
	}
	for round := range 2 {
		for i, o := range store.Run(ctx, takes) {
			if o.Err != nil || !o.Allowed || o.Quota.Used != 40 {
				t.Fatalf("round %d, take %d: %+v", round, i, o)
			}
		}
		for i, o := range store.Settle(ctx, refunds) {
			// 40 taken, 100 asked: 40 given back, the consumption 0.
			if o.Err != nil || o.Quota == nil || o.Quota.Used != 0 || !o.Cut {
				t.Fatalf("round %d, refund %d: %+v, want 0 used, cut to the receipt", round, i, o)
			}
		}
	}
}
