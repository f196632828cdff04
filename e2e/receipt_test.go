package e2e

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// receiptProxy calls a built tokengate-rls as a proxy holding the proxies'
// credential (trustCredential) would, with a stream's receipt id or none.
type receiptProxy struct {
	t      *testing.T
	rls    *rlsProc
	client rlsv3.RateLimitServiceClient
}

func newReceiptProxy(t *testing.T, rls *rlsProc) *receiptProxy {
	conn, err := grpc.NewClient(rls.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &receiptProxy{t: t, rls: rls, client: rlsv3.NewRateLimitServiceClient(conn)}
}

// call sends ShouldRateLimit with metadata md.
func (p *receiptProxy) call(md metadata.MD, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := p.client.ShouldRateLimit(metadata.NewOutgoingContext(ctx, md), &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds})
	if err != nil {
		p.t.Fatalf("call: %v", err)
	}
	return r
}

// md is a proxy's metadata: the credential, the receipt id id (none when
// ""), and the settlement's mark when settle.
func (p *receiptProxy) md(id string, settle bool) metadata.MD {
	md := metadata.Pairs("authorization", "Bearer "+trustCredential)
	if id != "" {
		md.Append(rlscontract.ReceiptHeader, id)
	}
	if settle {
		md.Append(rlscontract.SettleHeader, "1")
	}
	return md
}

// forge sends rule's key "victim" the forged settlements: a refund of
// 1,000 and a reset over gRPC and a refund over /json, each without a
// receipt id, with an id no take was made with and with an invalid one.
// Every call must be answered OK (a proxy's settlement is accepted; what
// it gives back is the test's to check).
func (p *receiptProxy) forge(rule string) {
	p.t.Helper()
	refund := trustDesc(0, rlscontract.RuleKey, rule, rlscontract.CompositeKey, "victim", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "1000")
	reset := trustDesc(0, rlscontract.RuleKey, rule, rlscontract.CompositeKey, "victim", rlscontract.SettleKey, "reset")
	for _, id := range []string{"", "0000000000000000", "5eed000000000002", "bad id!"} {
		p.call(p.md(id, true), refund)
		p.call(p.md(id, true), reset)
		body := `{"domain":"tokengate","descriptors":[{"entries":[{"key":"tokengate_rule","value":"` + rule +
			`"},{"key":"key","value":"victim"},{"key":"tokengate_settle","value":"refund"},{"key":"tokengate_amount","value":"1000"}]}]}`
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.rls.Admin+"/json", bytes.NewReader([]byte(body)))
		req.Header.Set("authorization", "Bearer "+trustCredential)
		if id != "" {
			req.Header.Set(rlscontract.ReceiptHeader, id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			p.t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			p.t.Fatalf("a proxy's %s refund over /json: %d, want 200", rule, resp.StatusCode)
		}
	}
}

// TestReceiptForgedByProxy: the forged refund and reset, now from
// a caller holding the proxies' credential (a compromised or buggy proxy),
// against the built tokengate-rls on a real Redis. A customer's stream
// spends the burst of 1,000; refunds and resets without a receipt id, with
// an id no take was made with, with an invalid id, over gRPC and /json,
// repeated three times, give nothing back: every later take is over the
// limit and the bucket is unchanged. The stream's own refund gives back
// its 1,000 once; a replay of it gives nothing more. Before receipts each
// forged refund gave back a burst: 3,000 tokens.
func TestReceiptForgedByProxy(t *testing.T) {
	redis := redistest.Start(t)
	p := newReceiptProxy(t, startTokengateRLSAuth(t, trustConfig, redis.Addr, "-credential-file", credentialFile(t, trustCredential)))
	call, proxy := p.call, p.md
	const stream = "5eed000000000001"
	take := func(hits uint64) rlsv3.RateLimitResponse_Code {
		return call(proxy(stream, false), trustDesc(hits, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "victim")).OverallCode
	}
	refund := trustDesc(0, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "victim", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "1000")

	if got := take(1000); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the stream's admission: %v", got)
	}
	before := redisTokens(t, redis, "tb:{llm:victim}")
	for round := range 3 {
		p.forge("llm")
		if got := take(1); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("round %d: a take after the forged refunds: %v, want OVER_LIMIT", round, got)
		}
	}
	if got := redisTokens(t, redis, "tb:{llm:victim}"); got != before {
		t.Errorf("the bucket after forged refunds: %q, want %q", got, before)
	}
	// The stream's own refund: its 1,000, once.
	for i, want := range []string{"1000.000000", "1000.000000"} {
		if i == 1 {
			if got := call(metadata.Pairs(rlscontract.ReceiptHeader, "5eed000000000003"), trustDesc(1000, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "victim")).OverallCode; got != rlsv3.RateLimitResponse_OK {
				t.Fatalf("another stream's admission: %v", got)
			}
			want = "0.000000"
		}
		call(proxy(stream, true), refund)
		if got := redisTokens(t, redis, "tb:{llm:victim}"); got != want {
			t.Errorf("the stream's refund %d: %q, want %q", i+1, got, want)
		}
	}
}

// quotaTrustConfig: a monthly quota of 1,000 whose usage the response
// reports, so that it settles.
const quotaTrustConfig = `{"rules":[
  {"name":"monthly","scope":"cluster","limit_keys":["header:x-api-key"],"algorithm":"quota",
   "algorithm_config":{"limit":1000,"period":"month","cost_source":"response_json:/usage/total_tokens","pre_charge":0}}],
 "settings":{"rls":{"cluster":"ratelimit","timeout_ms":2000,"on_error":"deny"}}}`

// TestQuotaReceiptForgedByProxy: TestReceiptForgedByProxy for a calendar
// quota, against the built tokengate-rls on a real Redis. A stream uses
// the month's 1,000; quota refunds and resets from a caller holding the
// proxies' credential, without a receipt id, with an id no take was made
// with, with an invalid id, over gRPC and /json, three times, give nothing
// back: the consumption stays 1,000 and every later take is over the
// limit. The stream's own refund gives back its 1,000 once; a replay after
// another stream used the month again gives nothing. Before quota
// receipts the first forged refund set the month's consumption to 0.
func TestQuotaReceiptForgedByProxy(t *testing.T) {
	redis := redistest.Start(t)
	p := newReceiptProxy(t, startTokengateRLSAuth(t, quotaTrustConfig, redis.Addr, "-credential-file", credentialFile(t, trustCredential)))
	call, proxy := p.call, p.md
	const stream = "5eed000000000001"
	take := func(id string, hits uint64) rlsv3.RateLimitResponse_Code {
		return call(proxy(id, false), trustDesc(hits, rlscontract.RuleKey, "monthly", rlscontract.CompositeKey, "victim")).OverallCode
	}
	refund := trustDesc(0, rlscontract.RuleKey, "monthly", rlscontract.CompositeKey, "victim", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "1000")

	start := time.Now().UTC()
	used := func() float64 {
		t.Helper()
		sameMonth(t, start) // else the consumption spans two periods: skipped
		return quotaUsed(t, redis, "monthly", "victim")
	}
	if got := take(stream, 1000); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the stream's admission: %v", got)
	}
	for round := range 3 {
		p.forge("monthly")
		if got := take("", 1); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			sameMonth(t, start)
			t.Fatalf("round %d: a take after the forged refunds: %v, want OVER_LIMIT", round, got)
		}
		if got := used(); got != 1000 {
			t.Fatalf("round %d: consumption after the forged refunds: %v, want 1000", round, got)
		}
	}
	// The stream's own refund: its 1,000, once.
	for i, want := range []float64{0, 1000} {
		if i == 1 {
			if got := take("5eed000000000003", 1000); got != rlsv3.RateLimitResponse_OK {
				t.Fatalf("another stream's admission: %v", got)
			}
		}
		call(proxy(stream, true), refund)
		if got := used(); got != want {
			t.Errorf("the stream's refund %d: consumption %v, want %v", i+1, got, want)
		}
	}
}
