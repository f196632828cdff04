package rls_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// TestSettleBounds: even from a proxy, a settlement call may name a bucket
// once (a refund repeated in one call is refused whole, pairwise and past
// eight descriptors alike), a refund gives back at most one burst and a
// charge takes at most a hundred.
func TestSettleBounds(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e := startServer(t, settleConfig, store)
	e.client = withReceipt(e.client, "0123456789abcdef") // one stream (docs/rls.md#receipts)
	settle := func(ds ...*ratelimitv3.RateLimitDescriptor) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, rlscontract.SettleHeader, "1")
		_, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds})
		return err
	}
	tokens := func(key string) string {
		v, _ := srv.Do("GET", key)
		if v == nil {
			return ""
		}
		s := v.(string)
		return s[:len(s)-len(":1736940000.000000")]
	}
	refund := func(key, n string) *ratelimitv3.RateLimitDescriptor {
		return settleDesc("llm", key, rlscontract.SettleKey, "refund", rlscontract.AmountKey, n)
	}
	if r := ask(t, e.client, "tokengate", ours("llm", "a", 100)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("admission: %v", r)
	}
	if err := settle(refund("a", "50"), refund("a", "50")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a bucket twice: %v, want InvalidArgument", err)
	}
	var many []*ratelimitv3.RateLimitDescriptor
	for i := range 10 {
		many = append(many, refund("k"+strconv.Itoa(i), "1"))
	}
	many = append(many, refund("a", "50"), refund("a", "50"))
	if err := settle(many...); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a bucket twice among 12: %v, want InvalidArgument", err)
	}
	if got := tokens("tb:{llm:a}"); got != "0.000000" {
		t.Fatalf("after refused calls: %q, want 0 (nothing applied)", got)
	}
	if err := settle(refund("a", "1e9")); err != nil {
		t.Fatal(err)
	}
	if got := tokens("tb:{llm:a}"); got != "100.000000" {
		t.Errorf("after a refund of 1e9: %q, want 100", got)
	}
	if err := settle(ours("llm", "a", 1e9)); err != nil {
		t.Fatal(err)
	}
	if got := tokens("tb:{llm:a}"); got != "-9900.000000" {
		t.Errorf("after a charge of 1e9: %q, want -9900 (100 - 100 bursts)", got)
	}
}
