package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// trustCredential is the proxies' credential in the trust tests.
const trustCredential = "proxy-secret-0123456789abcdef"

// trustConfig has the bucket: burst 1,000, a rate so low that no
// more than a few millionths refill during a test, charged after the
// response what the response reports (debt carried), and a lease-mode
// rule of the same size.
const trustConfig = `{"rules":[
  {"name":"llm","scope":"cluster","limit_keys":["header:x-api-key"],
   "algorithm_config":{"tokens_per_second":1e-6,"burst":1000,"cost_source":"response_json:/usage/total_tokens","pre_charge":0}},
  {"name":"pool","scope":"cluster","mode":"lease","limit_keys":["header:x-api-key"],
   "lease_ttl_ms":5000,"algorithm_config":{"tokens_per_second":1e-6,"burst":1000}}],
 "settings":{"rls":{"cluster":"ratelimit","timeout_ms":2000,"on_error":"deny"}}}`

// credentialFile writes the service's -credential-file.
func credentialFile(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// trustDesc is a descriptor of entries (key, value, key, value...) with
// hits_addend hits (0: none).
func trustDesc(hits uint64, kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	if hits > 0 {
		d.HitsAddend = wrapperspb.UInt64(hits)
	}
	return d
}

// TestTrustForgedWrites: the attacks, from a client that reaches
// the built tokengate-rls's ports but is no proxy (no credential, or a
// wrong one), on a real Redis. After a customer's bucket of burst 1,000
// is spent, forged refunds and resets (gRPC, with and without the settle
// header, and the admin port's /json) are refused with UNAUTHENTICATED or
// PERMISSION_DENIED (401/403) and admit nothing: every later take is
// over the limit and the bucket is unchanged in Redis. A forged charge of
// 1e9 is refused and leaves another key full; a forged lease grant takes
// nothing from the lease bucket; every refusal is counted. A proxy with
// the credential still settles the stream it admitted, and its amounts
// are bounded: a refund of 1e9 gives back one burst (what the stream
// took), a charge of 1e9 takes a hundred bursts, not a billion tokens.
// Plain decisions stay open to the unauthenticated client.
func TestTrustForgedWrites(t *testing.T) {
	redis := redistest.Start(t)
	rls := startTokengateRLSAuth(t, trustConfig, redis.Addr, "-credential-file", credentialFile(t, trustCredential))
	conn, err := grpc.NewClient(rls.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	call := func(md metadata.MD, ds ...*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if md != nil {
			ctx = metadata.NewOutgoingContext(ctx, md)
		}
		return client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds})
	}
	// The customer's requests come through the proxy, whose admissions
	// carry a stream's receipt id: its settlements give back no more than
	// that stream took (docs/rls.md#receipts).
	const stream = "e2e0000000000001"
	take := func(key string, hits uint64) rlsv3.RateLimitResponse_Code {
		t.Helper()
		r, err := call(metadata.Pairs(rlscontract.ReceiptHeader, stream), trustDesc(hits, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, key))
		if err != nil {
			t.Fatalf("plain take: %v", err)
		}
		return r.OverallCode
	}
	settleMD := metadata.Pairs(rlscontract.SettleHeader, "1")
	refund := trustDesc(0, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "victim", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "1000")
	reset := trustDesc(0, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "victim", rlscontract.SettleKey, "reset")

	// The customer spends its burst: plain decisions, open to anyone.
	if got := take("victim", 1000); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("taking the burst: %v", got)
	}
	if got := take("victim", 1); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after the burst: %v, want OVER_LIMIT", got)
	}
	before := redisTokens(t, redis, "tb:{llm:victim}")

	wrong := func(md metadata.MD) metadata.MD {
		return metadata.Join(md, metadata.Pairs("authorization", "Bearer not-the-proxy-secret-00"))
	}
	refused := 0
	for round := range 3 { // the attack repeated: 3,000 tokens
		for _, tc := range []struct {
			name string
			md   metadata.MD
			d    *ratelimitv3.RateLimitDescriptor
			want codes.Code
		}{
			{"refund", nil, refund, codes.Unauthenticated},
			{"refund with the header", settleMD, refund, codes.Unauthenticated},
			{"reset", nil, reset, codes.Unauthenticated},
			{"refund, wrong credential", wrong(nil), refund, codes.PermissionDenied},
			{"reset, wrong credential", wrong(settleMD), reset, codes.PermissionDenied},
			{"not a bearer", metadata.Pairs("authorization", trustCredential), reset, codes.PermissionDenied},
		} {
			_, err := call(tc.md, tc.d)
			if status.Code(err) != tc.want {
				t.Fatalf("round %d, forged %s: got %v, want %v", round, tc.name, err, tc.want)
			}
			refused++
		}
		for _, tc := range []struct {
			name, auth string
			want       int
		}{{"no credential", "", http.StatusUnauthorized}, {"wrong credential", "Bearer nope-nope-nope-nope", http.StatusForbidden}} {
			body := `{"domain":"tokengate","descriptors":[{"entries":[{"key":"tokengate_rule","value":"llm"},{"key":"key","value":"victim"},{"key":"tokengate_settle","value":"reset"}]}]}`
			req, _ := http.NewRequest(http.MethodPost, "http://"+rls.Admin+"/json", bytes.NewReader([]byte(body)))
			if tc.auth != "" {
				req.Header.Set("authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("round %d, forged reset over /json, %s: got %d, want %d", round, tc.name, resp.StatusCode, tc.want)
			}
			refused++
		}
		if got := take("victim", 1); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("round %d: a take after the forged writes: %v, want OVER_LIMIT (nothing admitted)", round, got)
		}
	}
	if got := redisTokens(t, redis, "tb:{llm:victim}"); got != before {
		t.Errorf("the victim's bucket after the forged writes: %q, want %q", got, before)
	}

	// A forged charge of 1e9 on another customer's key: refused, the key
	// stays full (its whole burst passes).
	if _, err := call(settleMD, trustDesc(1e9, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "other")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("forged charge: got %v, want Unauthenticated", err)
	}
	refused++
	if got := redisTokens(t, redis, "tb:{llm:other}"); got != "" {
		t.Errorf("a refused charge wrote the bucket: %q", got)
	}
	// A forged lease grant of the pool's whole burst: refused, nothing held.
	grant := trustDesc(0, rlscontract.RuleKey, "pool", rlscontract.CompositeKey, "victim", rlscontract.ModeKey, rlscontract.ModeLease,
		rlscontract.HolderKey, "attacker", rlscontract.GrantKey, "0", rlscontract.UnspentKey, "0", rlscontract.WantKey, "1000")
	if _, err := call(nil, grant); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("forged lease grant: got %v, want Unauthenticated", err)
	}
	refused++
	if v, err := redis.Do("EXISTS", "tl:{pool:victim}"); err != nil || v != int64(0) {
		t.Errorf("a refused lease grant wrote the bucket: %v %v", v, err)
	}
	if got := take("other", 1000); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("the other customer's burst after the forged charge: %v, want OK", got)
	}

	// The proxy, with the credential: a refund and a reset work, and the
	// amounts are bounded by the burst.
	proxy := metadata.Pairs("authorization", "Bearer "+trustCredential, rlscontract.SettleHeader, "1", rlscontract.ReceiptHeader, stream)
	huge := trustDesc(0, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "other", rlscontract.SettleKey, "refund", rlscontract.AmountKey, "1e9")
	if _, err := call(proxy, huge); err != nil {
		t.Fatalf("the proxy's refund: %v", err)
	}
	if got := redisTokens(t, redis, "tb:{llm:other}"); got != "1000.000000" {
		t.Errorf("after a refund of 1e9 into an empty bucket: %q, want 1000 (one burst)", got)
	}
	if _, err := call(proxy, trustDesc(1e9, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "other")); err != nil {
		t.Fatalf("the proxy's charge: %v", err)
	}
	if raw := redisTokens(t, redis, "tb:{llm:other}"); !strings.HasPrefix(raw, "-99000.") && !strings.HasPrefix(raw, "-98999.99") {
		t.Errorf("after a charge of 1e9: %q, want -99000 (a hundred bursts taken, not a billion tokens)", raw)
	}
	if _, err := call(proxy, reset); err != nil {
		t.Fatalf("the proxy's reset: %v", err)
	}
	if got := redisTokens(t, redis, "tb:{llm:victim}"); got != "" {
		t.Errorf("after the proxy's reset: %q, want no key (a full bucket)", got)
	}
	if _, err := call(metadata.Pairs("authorization", "Bearer "+trustCredential), grant); err != nil {
		t.Errorf("the proxy's lease grant: %v", err)
	}

	_, body := getURL(t, "http://"+rls.Admin+"/metrics", nil)
	n := 0
	for _, m := range regexp.MustCompile(`(?m)^tokengate_rls_writes_refused_total\{reason="[a-z_]+"\} (\d+)$`).FindAllStringSubmatch(body, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	if n != refused {
		t.Errorf("tokengate_rls_writes_refused_total: %d in all, want %d", n, refused)
	}
	if !strings.Contains(body, "tokengate_rls_settle_clamped_total 2") {
		t.Errorf("tokengate_rls_settle_clamped_total: want 2 (the refund and the charge of 1e9)")
	}
}

// TestTrustDefaultRefusesWrites: with no credential file and no client
// CA, the service refuses every write (and says so at start), while its
// plain decisions answer.
func TestTrustDefaultRefusesWrites(t *testing.T) {
	redis := redistest.Start(t)
	rls := startTokengateRLSAuth(t, trustConfig, redis.Addr)
	conn, err := grpc.NewClient(rls.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+trustCredential)
	r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		trustDesc(1000, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "k")}})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("plain decision: %v %v", r, err)
	}
	_, err = client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		trustDesc(0, rlscontract.RuleKey, "llm", rlscontract.CompositeKey, "k", rlscontract.SettleKey, "reset")}})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a reset with no credential configured: %v, want PermissionDenied", err)
	}
	if got := redisTokens(t, redis, "tb:{llm:k}"); got != "0.000000" {
		t.Errorf("tokens after the refused reset: %q, want 0", got)
	}
	if out := rls.out.String(); !strings.Contains(out, "settlements and lease calls are refused") {
		t.Errorf("no warning at start:\n%s", out)
	}
}

// TestTrustModuleWithoutCredential: the built module without
// settings.rls.credential, against a service that requires one, gets its
// decisions but not its settlements: the settlement is refused (counted
// in tokengate.rls_settle_errors) and the bucket keeps only the
// admission's hit; with the wrong credential likewise.
func TestTrustModuleWithoutCredential(t *testing.T) {
	for _, tc := range []struct{ name, credential string }{{"none", ""}, {"wrong", "a-credential-of-another-fleet"}} {
		t.Run(tc.name, func(t *testing.T) {
			redis := redistest.Start(t)
			rls := startTokengateRLSAuth(t, clusterSettleConfig, redis.Addr, "-credential-file", credentialFile(t, trustCredential))
			cfg := clusterSettleConfig
			if tc.credential != "" {
				cfg = strings.Replace(cfg, `"cluster":"ratelimit"`, `"cluster":"ratelimit","credential":"`+tc.credential+`"`, 1)
			}
			h, srv := startSettleFleetHost(t, cfg, rlsBootstrap(rls.Addr), settleUpstream())
			if r := mustDo(t, srv.Client(), srv, "/llm?tokens=42", map[string]string{"x-api-key": "k1"}); r.status != 200 {
				t.Fatalf("got %d, want 200", r.status)
			}
			waitFor(t, func() bool { v, _ := h.Metric("tokengate.rls_settle_errors"); return v == 1 })
			if got := redisTokens(t, redis, "tb:{llm:k1}"); got != "99.000000" {
				t.Errorf("tokens: %q, want 99 (the admission's hit only)", got)
			}
		})
	}
}

// TestTrustLeaseCredential: the built module's lease calls are writes.
// With settings.rls.credential, its holder's grants land in the lease
// bucket (a holder field in Redis) and none is refused; without it, the
// service refuses them (counted) and no holder ever holds a grant.
func TestTrustLeaseCredential(t *testing.T) {
	for _, withCred := range []bool{true, false} {
		t.Run(strconv.FormatBool(withCred), func(t *testing.T) {
			cfg := leaseRule(5, 50, 10, "deny")
			redis := redistest.Start(t)
			rls := startTokengateRLSAuth(t, strings.Replace(cfg, `"cluster":"ratelimit"`, `"cluster":"ratelimit","credential":"`+trustCredential+`"`, 1),
				redis.Addr, "-credential-file", credentialFile(t, trustCredential))
			if withCred {
				cfg = strings.Replace(cfg, `"cluster":"ratelimit"`, `"cluster":"ratelimit","credential":"`+trustCredential+`"`, 1)
			}
			h, srv := startClusterHost(t, cfg, rlsBootstrap(rls.Addr), 1)
			held := func() bool {
				v, err := redis.Do("HGETALL", "tl:{lease:k}")
				if err != nil {
					t.Fatal(err)
				}
				fields, _ := v.([]any)
				for i := 0; i < len(fields); i += 2 {
					if f, _ := fields[i].(string); strings.HasPrefix(f, "h:") {
						return true
					}
				}
				return false
			}
			// Back to back: a request within a refill period of a call
			// granted in full makes the next call a holder's lease
			// (docs/lease.md), not an exact take.
			for i := 0; i < 40 && !(withCred && held()); i++ {
				resp, _ := getURL(t, srv.URL+"/", map[string]string{"x-api-key": "k"})
				if resp.StatusCode != 200 && resp.StatusCode != 429 && resp.StatusCode != 503 {
					t.Fatalf("request %d: %d", i, resp.StatusCode)
				}
			}
			calls, _ := h.Metric("tokengate.lease_calls")
			_, body := getURL(t, "http://"+rls.Admin+"/metrics", nil)
			refused := !strings.Contains(body, `tokengate_rls_writes_refused_total{reason="no_credential"} 0`)
			if withCred {
				if !held() || refused {
					t.Errorf("with the credential: a grant held %v, writes refused %v (lease calls %d)", held(), refused, calls)
				}
				return
			}
			if calls == 0 {
				t.Fatal("no lease call made")
			}
			if held() || !refused {
				t.Errorf("without the credential: a grant held %v, writes refused %v (lease calls %d)", held(), refused, calls)
			}
		})
	}
}
