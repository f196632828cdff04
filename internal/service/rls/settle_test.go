package rls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// TestSettleScriptMatchesBucket runs internal/service/redisstore/settle.lua (charge, refund, reset)
// interleaved with internal/service/redisstore/tokenbucket.lua's takes with a debt, and bucket.Limit's
// Charge, Refund, Reset and Take on the same instants and amounts: the
// stored value must be the filter's, byte for byte, and a take in debt
// must be rejected as bucket.Limit rejects it.
func TestSettleScriptMatchesBucket(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	rng := rand.New(rand.NewPCG(3, 4))
	limits := []bucket.Limit{
		{Rate: 5, Burst: 10, MaxDebt: 10},
		{Rate: 0.3, Burst: 2.5, MaxDebt: 7},
		{Rate: 123.456, Burst: 987.654, MaxDebt: 50},
		{Rate: 1, Burst: 3}, // count_statuses: no debt
	}
	for li, l := range limits {
		key := fmt.Sprintf("tb:{settle:%d}", li)
		micros := int64(1736940000) * 1e6
		st := bucket.State{}
		fresh := true
		for step := range 300 {
			if rng.IntN(10) == 0 {
				micros -= rng.Int64N(1500000)
			} else {
				micros += rng.Int64N(2000000)
			}
			now := sharedstate.Quantize(float64(micros) / 1e6)
			nowStr := strconv.FormatFloat(now, 'f', 6, 64)
			if fresh {
				st = l.Full(now)
			}
			amount := float64(1+rng.IntN(int(2*l.Burst)+1)) + float64(rng.IntN(4))*0.25
			var want bucket.State
			allowed := true
			var got redisstore.Outcome
			kind := []string{"take", "charge", "refund", "reset"}[rng.IntN(4)]
			switch kind {
			case "take":
				var res bucket.Result
				want, res = l.Take(st, now, amount)
				allowed = res.Allowed
				got = store.Run(context.Background(), []redisstore.Op{{Key: key, Rate: l.Rate, Burst: l.Burst, Cost: amount, MaxDebt: l.MaxDebt, Now: nowStr}})[0]
			case "charge", "refund", "reset":
				switch kind {
				case "charge":
					want = l.Charge(st, now, amount)
				case "refund":
					want = l.Refund(st, now, amount)
				default:
					want = l.Reset(st, now)
				}
				got = store.Settle(context.Background(), []redisstore.SettleOp{{Key: key, Rate: l.Rate, Burst: l.Burst, MaxDebt: l.MaxDebt,
					Kind: rlscontract.SettleKind(kind), Amount: amount, Now: nowStr}})[0]
			}
			if got.Err != nil {
				t.Fatalf("limit %d step %d %s: %v", li, step, kind, got.Err)
			}
			if got.Allowed != allowed {
				t.Fatalf("limit %d step %d %s %v at %s (state %+v): allowed %v, want %v", li, step, kind, amount, nowStr, st, got.Allowed, allowed)
			}
			if !allowed {
				continue
			}
			v, _ := srv.Do("GET", key)
			if kind == "reset" {
				// The key is deleted: a missing key is a full bucket.
				if v != nil {
					t.Fatalf("limit %d step %d: reset left %v", li, step, v)
				}
				fresh = true
				continue
			}
			wantStored := string(sharedstate.AppendState(nil, want))
			if v != wantStored {
				t.Fatalf("limit %d step %d %s %v at %s (state %+v): stored %v, want %s", li, step, kind, amount, nowStr, st, v, wantStored)
			}
			st, _ = sharedstate.ParseState([]byte(wantStored))
			fresh = false
		}
	}
}

// settleConfig has cluster rules that settle, one that does not, and a
// lease-mode rule.
const settleConfig = `{"rules":[
  {"name":"llm","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"tokens_per_second":0.000001,"burst":100,"cost_source":"response_json:/usage/total_tokens"}},
  {"name":"login","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"tokens_per_second":0.000001,"burst":3,"count_statuses":[401]}},
  {"name":"plain","scope":"cluster","algorithm_config":{"tokens_per_second":0.000001,"burst":3}}],
 "settings":{"rls":{"cluster":"rls"}}}`

func settleDesc(rule, key string, kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := ours(rule, key, 0)
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestServerSettle: a settlement call (the filter's header) charges extra
// hits into debt, carried in full (issue 22: no floor forgives a report far
// above the burst), refunds capped at burst and resets;
// the same plain descriptor without the header is a take, which a bucket
// in debt rejects. Malformed settlements and rules that do not settle are
// INVALID_ARGUMENT, with nothing applied.
func TestServerSettle(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e := startServer(t, settleConfig, store)
	// One stream: its admissions and settlements carry its receipt id
	// (docs/rls.md#receipts).
	e.client = withReceipt(e.client, "0123456789abcdef")
	settleCtx := func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		return metadata.AppendToOutgoingContext(ctx, rlscontract.SettleHeader, "1"), cancel
	}
	settle := func(ds ...*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := settleCtx()
		defer cancel()
		return e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds})
	}
	tokens := func(key string) string {
		v, _ := srv.Do("GET", key)
		if v == nil {
			return ""
		}
		s := v.(string)
		return s[:len(s)-len(":1736940000.000000")]
	}

	if r := ask(t, e.client, "tokengate", ours("llm", "192.0.2.1", 1)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("admission: %v", r)
	}
	r, err := settle(ours("llm", "192.0.2.1", 150))
	if err != nil || len(r.Statuses) != 1 || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("charge: %v %v", r, err)
	}
	if got := tokens("tb:{llm:192.0.2.1}"); got != "-51.000000" {
		t.Fatalf("after 1 + 150: %q, want -51 (100 - 151, nothing forgiven)", got)
	}
	if r := ask(t, e.client, "tokengate", ours("llm", "192.0.2.1", 1)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a take in debt: %v, want OVER_LIMIT", r)
	}
	if _, err := settle(settleDesc("llm", "192.0.2.1", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "61.5")); err != nil {
		t.Fatal(err)
	}
	if got := tokens("tb:{llm:192.0.2.1}"); got != "10.500000" {
		t.Fatalf("after a refund of 61.5: %q, want 10.5", got)
	}
	// A refund is capped at burst; a reset deletes the key.
	if _, err := settle(settleDesc("llm", "192.0.2.1", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "1000")); err != nil {
		t.Fatal(err)
	}
	if got := tokens("tb:{llm:192.0.2.1}"); got != "100.000000" {
		t.Fatalf("after a refund of 1000: %q, want 100", got)
	}
	ask(t, e.client, "tokengate", ours("login", "192.0.2.1", 1))
	// The refund entries alone make a settlement call, without the header.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{settleDesc("login", "192.0.2.1", rlscontract.SettleKey, "reset")}}); err != nil {
		t.Fatal(err)
	}
	if got := tokens("tb:{login:192.0.2.1}"); got != "" {
		t.Fatalf("after a reset: %q, want no key", got)
	}

	for _, tc := range []struct {
		name string
		ds   []*ratelimitv3.RateLimitDescriptor
	}{
		{"a rule that does not settle", []*ratelimitv3.RateLimitDescriptor{ours("plain", "", 1)}},
		{"an unknown rule", []*ratelimitv3.RateLimitDescriptor{ours("nope", "", 1)}},
		{"a negative refund", []*ratelimitv3.RateLimitDescriptor{settleDesc("llm", "x", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "-1")}},
		{"a refund without amount", []*ratelimitv3.RateLimitDescriptor{settleDesc("llm", "x", rlscontract.SettleKey, "refund")}},
		{"an unknown kind", []*ratelimitv3.RateLimitDescriptor{settleDesc("llm", "x", rlscontract.SettleKey, "double")}},
		{"one bad among good", []*ratelimitv3.RateLimitDescriptor{ours("llm", "y", 5), ours("plain", "", 1)}},
	} {
		if _, err := settle(tc.ds...); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", tc.name, err)
		}
	}
	if got := tokens("tb:{llm:y}"); got != "" {
		t.Errorf("a refused call applied a settlement: %q", got)
	}
}
