package rls_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// receiptClient sends every call with the receipt id of one stream, as
// the filter does (docs/rls.md#receipts).
type receiptClient struct {
	rlsv3.RateLimitServiceClient
	id string
}

func (c receiptClient) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, opts ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	return c.RateLimitServiceClient.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, rlscontract.ReceiptHeader, c.id), in, opts...)
}

// withReceipt returns c sending the receipt id of one stream ("": none).
func withReceipt(c rlsv3.RateLimitServiceClient, id string) rlsv3.RateLimitServiceClient {
	if id == "" {
		return c
	}
	return receiptClient{c, id}
}

// settleCall sends one settlement call as the filter does (the settle
// header) from client c.
func settleCall(c rlsv3.RateLimitServiceClient, ds ...*ratelimitv3.RateLimitDescriptor) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, rlscontract.SettleHeader, "1")
	_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds})
	return err
}

func refundDesc(rule, key, n string) *ratelimitv3.RateLimitDescriptor {
	return settleDesc(rule, key, rlscontract.SettleKey, "refund", rlscontract.AmountKey, n)
}

// TestReceiptsBoundSettlements: with writes open to it (an authenticated
// proxy), a caller gives back only what its own stream took and was not
// given back. Stream A takes 30 and stream B 50 of key k (burst 100);
// refunds without a receipt id, with an id that took nothing, or with an
// invalid id give nothing back, nor does a reset without a receipt; A's
// refund of 1000 gives back its 30, once; B's charge adds to its receipt;
// a take refunded because another descriptor of its call was over the
// limit leaves no receipt. Before receipts, each forged refund refilled
// the bucket up to its burst.
func TestReceiptsBoundSettlements(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e := startServer(t, settleConfig, store)
	tokens := func(key string) string {
		t.Helper()
		v, _ := srv.Do("GET", key)
		if v == nil {
			return "full"
		}
		s := v.(string)
		return s[:len(s)-len(":1736940000.000000")]
	}
	a, b := withReceipt(e.client, "aaaaaaaaaaaaaaa1"), withReceipt(e.client, "bbbbbbbbbbbbbbb2")
	if r := ask(t, a, "tokengate", ours("llm", "k", 30)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("A's admission: %v", r)
	}
	if r := ask(t, b, "tokengate", ours("llm", "k", 50)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("B's admission: %v", r)
	}
	steps := []struct {
		name   string
		c      rlsv3.RateLimitServiceClient
		d      *ratelimitv3.RateLimitDescriptor
		tokens string
	}{
		{"a refund without a receipt id", e.client, refundDesc("llm", "k", "100"), "20.000000"},
		{"a refund with an id that took nothing", withReceipt(e.client, "ccccccccccccccc3"), refundDesc("llm", "k", "100"), "20.000000"},
		{"a refund with an invalid id", withReceipt(e.client, "short"), refundDesc("llm", "k", "100"), "20.000000"},
		{"a refund with the id a settlement without one reads", withReceipt(e.client, "-"), refundDesc("llm", "k", "100"), "20.000000"},
		{"a reset without a receipt", e.client, settleDesc("llm", "k", rlscontract.SettleKey, "reset"), "20.000000"},
		{"a reset with an id that took nothing", withReceipt(e.client, "ccccccccccccccc3"), settleDesc("llm", "k", rlscontract.SettleKey, "reset"), "20.000000"},
		{"A's refund of 1000 gives its 30", a, refundDesc("llm", "k", "1000"), "50.000000"},
		{"A's refund again gives nothing", a, refundDesc("llm", "k", "1000"), "50.000000"},
		{"B's refund of 20", b, refundDesc("llm", "k", "20"), "70.000000"},
		{"B's charge of 40 adds to its receipt", b, ours("llm", "k", 40), "30.000000"},
		{"B's refund of 1000 gives its 50 + 40 - 20", b, refundDesc("llm", "k", "1000"), "100.000000"},
	}
	for _, st := range steps {
		if err := settleCall(st.c, st.d); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := tokens("tb:{llm:k}"); got != st.tokens {
			t.Fatalf("%s: tokens %s, want %s", st.name, got, st.tokens)
		}
	}
	if n, _ := srv.Do("EXISTS", "tb:{llm:k}:r:aaaaaaaaaaaaaaa1", "tb:{llm:k}:r:bbbbbbbbbbbbbbb2", "tb:{llm:k}:r:-"); n != int64(0) {
		t.Errorf("receipts given back in full: %v keys left, want 0", n)
	}

	// A reset with a receipt fills the bucket and uses the receipt up.
	c := withReceipt(e.client, "ddddddddddddddd4")
	ask(t, c, "tokengate", ours("login", "k", 2))
	if pttl, _ := srv.Do("PTTL", "tb:{login:k}:r:ddddddddddddddd4"); pttl.(int64) <= 0 || pttl.(int64) > 900000 {
		t.Errorf("the receipt's TTL: %v ms, want up to 15 minutes", pttl)
	}
	for i, want := range []string{"full", "full"} {
		if i == 1 {
			ask(t, withReceipt(e.client, "eeeeeeeeeeeeeee5"), "tokengate", ours("login", "k", 3)) // another stream empties it
			want = "0.000000"
		}
		if err := settleCall(c, settleDesc("login", "k", rlscontract.SettleKey, "reset")); err != nil {
			t.Fatal(err)
		}
		if got := tokens("tb:{login:k}"); got != want {
			t.Errorf("reset %d: tokens %s, want %s", i+1, got, want)
		}
	}

	// All or nothing: a take given back because its call was over the
	// limit on another rule leaves nothing to refund.
	f := withReceipt(e.client, "fffffffffffffff6")
	if r := ask(t, f, "tokengate", ours("llm", "j", 40), ours("plain", "", 5)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("over the limit on plain: %v", r)
	}
	if n, _ := srv.Do("EXISTS", "tb:{llm:j}:r:fffffffffffffff6"); n != int64(0) {
		t.Errorf("a take given back kept its receipt")
	}
	if r := ask(t, e.client, "tokengate", ours("llm", "j", 100)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("another caller's take: %v", r)
	}
	if err := settleCall(f, refundDesc("llm", "j", "40")); err != nil {
		t.Fatal(err)
	}
	if got := tokens("tb:{llm:j}"); got != "0.000000" {
		t.Errorf("a refund of a take given back: tokens %s, want 0", got)
	}
	// A take without an id writes no receipt: plain decisions stay as
	// they were.
	if keys, _ := srv.Do("KEYS", "tb:{llm:j}:r:*"); len(keys.([]any)) != 0 {
		t.Errorf("receipts %v, want none", keys)
	}
}

// TestReceiptsHammer: streams of an authenticated proxy at once, on one
// key of burst 100 refilled at 5 tokens a second. Honest streams take 5
// and give 2 back (they keep 3); greedy ones take 5 and ask for 50 back
// three times; forgers ask for 100 back with no receipt id, an id that
// took nothing, or another's id never sent (random). What was kept can
// never exceed what burst + rate × T admits: 3 × honest admissions <=
// 100 + 5 × T. Before receipts, the forged refunds refilled the bucket
// and the honest streams were admitted about as often as they asked.
func TestReceiptsHammer(t *testing.T) {
	const cfg = `{"rules":[{"name":"llm","scope":"cluster","limit_keys":["ip:address"],` +
		`"algorithm_config":{"tokens_per_second":5,"burst":100,"cost_source":"response_json:/usage/total_tokens"}}],` +
		`"settings":{"rls":{"cluster":"rls"}}}`
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e := startServer(t, cfg, store)

	var honest, asked atomic.Int64
	var ids atomic.Int64
	nextID := func() string { return strconv.FormatInt(1e15+ids.Add(1), 16) }
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				switch w % 3 {
				case 0, 1: // honest (0) and greedy (1) streams
					c := withReceipt(e.client, nextID())
					r := askGo(t, c, "tokengate", ours("llm", "k", 5))
					if r == nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
						continue
					}
					if w%3 == 0 {
						asked.Add(1)
						if settleCall(c, refundDesc("llm", "k", "2")) == nil {
							honest.Add(1)
						}
						continue
					}
					for range 3 {
						_ = settleCall(c, refundDesc("llm", "k", "50"))
					}
				default: // forgers
					id := [...]string{"", "0000000000000000", nextID()}[i%3]
					_ = settleCall(withReceipt(e.client, id), refundDesc("llm", "k", "100"))
					_ = settleCall(withReceipt(e.client, id), settleDesc("llm", "k", rlscontract.SettleKey, "reset"))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds() + 1 // generous: the bound only grows with T
	if honest.Load() != asked.Load() {
		t.Fatalf("%d of %d honest refunds failed", asked.Load()-honest.Load(), asked.Load())
	}
	if kept, bound := 3*float64(honest.Load()), 100+5*elapsed; kept > bound {
		t.Errorf("honest streams kept %v tokens in %.1f s, more than burst + rate × T = %.1f: forged refunds gave tokens back", kept, elapsed, bound)
	}
	if honest.Load() == 0 {
		t.Errorf("no honest stream was admitted")
	}
	t.Logf("%d honest streams admitted in %.1f s", honest.Load(), elapsed)
}
