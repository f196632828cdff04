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

// TestReceiptScripts: what tokenbucket.lua and settle.lua do with a
// stream's receipt, on a real Redis. A take adds what it took (a rejected
// take nothing), a refund of this call's take (cost < 0) takes it off, a
// settlement's refund gives back at most the receipt and takes off what it
// asked, a charge adds what it took, and a reset needs a receipt above 0
// and deletes it; without a receipt key the scripts are as before (the
// arithmetic tests).
func TestReceiptScripts(t *testing.T) {
	srv := redistest.Start(t)
	store := readyStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	ctx := context.Background()
	tb := redisstore.BucketKey("llm", "k")
	rk := redisstore.ReceiptKey(tb, "0123456789abcdef")
	if rk != "tb:{llm:k}:r:0123456789abcdef" {
		t.Fatalf("receipt key %q", rk)
	}
	const now = "1736940000.000000" // no refill in between
	take := func(cost float64) redisstore.Outcome {
		t.Helper()
		o := store.Run(ctx, []redisstore.Op{{Key: tb, Rate: 1, Burst: 100, Cost: cost, MaxDebt: 1e12, Now: now, Receipt: rk}})[0]
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		return o
	}
	settle := func(kind rlscontract.SettleKind, amount float64, receipt string) redisstore.Outcome {
		t.Helper()
		o := store.Settle(ctx, []redisstore.SettleOp{{Key: tb, Rate: 1, Burst: 100, MaxDebt: 1e12, Kind: kind, Amount: amount, Now: now, Receipt: receipt}})[0]
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		return o
	}
	receipt := func() string {
		v, _ := srv.Do("GET", rk)
		if v == nil {
			return "none"
		}
		return v.(string)
	}
	steps := []struct {
		name         string
		do           func() redisstore.Outcome
		tokens       float64
		cut          bool
		receiptAfter string
	}{
		{"take 30", func() redisstore.Outcome { return take(30) }, 70, false, "30"},
		{"take 25", func() redisstore.Outcome { return take(25) }, 45, false, "55"},
		{"a rejected take of 50", func() redisstore.Outcome { return take(50) }, 45, false, "55"},
		{"this call's refund of 25", func() redisstore.Outcome { return take(-25) }, 70, false, "30"},
		{"refund 10", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 10, rk) }, 80, false, "20"},
		{"charge 15", func() redisstore.Outcome { return settle(rlscontract.SettleCharge, 15, rk) }, 65, false, "35"},
		{"refund 1000: the receipt's 35", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 1000, rk) }, 100, true, "none"},
		{"take 60", func() redisstore.Outcome { return take(60) }, 40, false, "60"},
		{"refund with another receipt", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 10, rk+"x") }, 40, true, "60"},
		{"reset with another receipt", func() redisstore.Outcome { return settle(rlscontract.SettleReset, 0, rk+"x") }, 40, true, "60"},
		{"reset with the receipt", func() redisstore.Outcome { return settle(rlscontract.SettleReset, 0, rk) }, 100, false, "none"},
		{"take 70", func() redisstore.Outcome { return take(70) }, 30, false, "70"},
		{"a refund without a receipt key: capped at burst only", func() redisstore.Outcome { return settle(rlscontract.SettleRefund, 50, "") }, 80, false, "70"},
	}
	for _, st := range steps {
		o := st.do()
		if o.Tokens != st.tokens || o.Cut != st.cut || receipt() != st.receiptAfter {
			t.Fatalf("%s: tokens %v cut %v receipt %s, want %v %v %s", st.name, o.Tokens, o.Cut, receipt(), st.tokens, st.cut, st.receiptAfter)
		}
	}
	if pttl, _ := srv.Do("PTTL", rk); pttl.(int64) <= 0 || pttl.(int64) > 900000 {
		t.Errorf("the receipt's TTL: %v ms, want up to 15 minutes", pttl)
	}
	// A take without a receipt writes none.
	store.Run(ctx, []redisstore.Op{{Key: redisstore.BucketKey("llm", "j"), Rate: 1, Burst: 100, Cost: 1, MaxDebt: 1e12}})
	if keys, _ := srv.Do("KEYS", "tb:{llm:j}*"); len(keys.([]any)) != 1 {
		t.Errorf("keys %v, want the bucket alone", keys)
	}
}

// TestReceiptCluster: on a Redis Cluster of three masters, a take and a
// settlement with their receipt (two keys of one hash tag) run in one
// pipeline on whichever master holds each bucket, and the receipt bounds
// the refund there as on one node.
func TestReceiptCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	store := readyStore(t, redisstore.Options{Addrs: c.Addrs(), Cluster: true, Timeout: 2 * time.Second})
	ctx := context.Background()
	var takes []redisstore.Op
	var refunds []redisstore.SettleOp
	nodes := map[int]bool{}
	for i := range 12 {
		key := redisstore.BucketKey("llm", "k"+strconv.Itoa(i))
		nodes[c.NodeFor(key)] = true
		rk := redisstore.ReceiptKey(key, "0123456789abcdef")
		takes = append(takes, redisstore.Op{Key: key, Rate: 1e-6, Burst: 100, Cost: 40, MaxDebt: 1e12, Receipt: rk})
		refunds = append(refunds, redisstore.SettleOp{Key: key, Rate: 1e-6, Burst: 100, MaxDebt: 1e12, Kind: rlscontract.SettleRefund, Amount: 100, Receipt: rk})
	}
	if len(nodes) < 2 {
		t.Fatalf("the buckets fell on %d master(s)", len(nodes))
	}
	for round := range 2 {
		for i, o := range store.Run(ctx, takes) {
			if o.Err != nil || !o.Allowed {
				t.Fatalf("round %d, take %d: %+v", round, i, o)
			}
		}
		for i, o := range store.Settle(ctx, refunds) {
			// 40 taken, 100 asked: 40 given back, the bucket full again.
			if o.Err != nil || o.Tokens < 99.99 || o.Tokens > 100 || !o.Cut {
				t.Fatalf("round %d, refund %d: %+v, want 100 tokens, cut to the receipt", round, i, o)
			}
		}
	}
}

// BenchmarkTakeReceipt: one take of a rule that settles, without and with
// a new receipt (as each stream's admission), sent 64 to a pipeline from
// one caller; redis-µs/take is Redis's own time per EVALSHA (INFO
// commandstats), the cost of the receipt's write.
func BenchmarkTakeReceipt(b *testing.B) {
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
					key := redisstore.BucketKey("llm", strconv.Itoa(n%10000))
					ops[i] = redisstore.Op{Key: key, Rate: 1e6, Burst: 1e6, Cost: 1, MaxDebt: 1e12}
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
