package rls_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// quotaConfig has quota rules of each kind the tests need, a token
// bucket to combine them with, and a quota whose cost the response
// reports.
func quotaConfig(limit string) string {
	return `{"rules": [
  {"name": "daily", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "quota",
   "algorithm_config": {"limit": ` + limit + `, "period": "day", "time_zone": "Europe/Paris", "thresholds": [0.5, 0.8],
     "limit_source": "jwt:quota", "max_limit": 50}},
  {"name": "monthly", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm": "quota",
   "algorithm_config": {"limit": 1000, "period": "month", "billing_day": 31, "cost_source": "response_json:/usage/total_tokens", "pre_charge": 100}},
  {"name": "bucket", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm_config": {"tokens_per_second": 0.000001, "burst": 2}}
 ],
 "settings": {"rls": {"cluster": "rls"}}}`
}

// fixedClock is a quota clock tests move by hand.
type fixedClock struct{ t time.Time }

func (c *fixedClock) now() time.Time { return c.t }

// startQuota serves quotaConfig(limit) on store with its clock at now.
func startQuota(t *testing.T, store rls.Runner, limit string, now time.Time) (env, *fixedClock) {
	t.Helper()
	e := startServer(t, quotaConfig(limit), store)
	clk := &fixedClock{t: now}
	e.srv.SetClock(clk.now)
	return e, clk
}

// withLimit is the descriptor of a quota rule whose identity carries limit.
func withLimit(rule, key, limit string, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d := ours(rule, key, hits)
	d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rlscontract.LimitKey, Value: limit})
	return d
}

// noon is 2026-05-04 12:00 in Paris (CEST, UTC+2): the day ends in 12 h.
var noon = time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)

// dayKey is the consumption key of rule "daily" for key k on 2026-05-04
// in Paris.
func dayKey(k string) string {
	return "qt:{daily:" + k + "}:" + strconv.FormatInt(time.Date(2026, 5, 3, 22, 0, 0, 0, time.UTC).Unix(), 10)
}

func hget(t *testing.T, srv *redistest.Server, key, field string) string {
	t.Helper()
	v, err := srv.Do("HGET", key, field)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := v.(string)
	return s
}

// TestQuotaExact: a quota admits exactly its limit in a period, counts
// no denied request, answers the limit, the remaining units and the
// seconds to the period's end, and starts again in the next period; on a
// single Redis and on a Cluster (the consumption and the override share
// a slot).
func TestQuotaExact(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		store := newStore(t, b.addrs, b.cluster, 2*time.Second)
		e, clk := startQuota(t, store, "5", noon)
		for i := 1; i <= 8; i++ {
			r := ask(t, e.client, "tokengate", ours("daily", "k1", 1))
			st := r.Statuses[0]
			wantOK := i <= 5
			if got := r.OverallCode == rlsv3.RateLimitResponse_OK; got != wantOK {
				t.Fatalf("request %d: %v, want OK %v", i, r.OverallCode, wantOK)
			}
			wantLeft := uint32(max(5-i, 0))
			if st.LimitRemaining != wantLeft {
				t.Errorf("request %d: remaining %d, want %d", i, st.LimitRemaining, wantLeft)
			}
			if st.CurrentLimit.GetRequestsPerUnit() != 5 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
				t.Errorf("request %d: current_limit %v, want 5 per DAY", i, st.CurrentLimit)
			}
			if got := st.DurationUntilReset.AsDuration(); got != 12*time.Hour {
				t.Errorf("request %d: duration_until_reset %v, want 12h (the end of the day in Paris)", i, got)
			}
			if got, want := header(r, "ratelimit-policy"), `"daily";q=5;w=86400`; got != want {
				t.Errorf("request %d: RateLimit-Policy %q, want %q", i, got, want)
			}
			if got, want := header(r, "ratelimit"), `"daily";r=`+strconv.Itoa(int(wantLeft))+`;t=43200`; got != want {
				t.Errorf("request %d: RateLimit %q, want %q", i, got, want)
			}
		}
		// Only the admitted requests are counted, under the Paris day's
		// start, living an hour to 70 minutes after its end.
		get := func(args ...string) any {
			if b.single != nil {
				return b.single.MustDo(args...)
			}
			return b.c.Nodes[b.c.NodeFor(args[1])].MustDo(args...)
		}
		if got := get("HGET", dayKey("k1"), "u"); got != "5" {
			t.Errorf("consumption: %v, want 5", got)
		}
		if ttl := get("TTL", dayKey("k1")).(int64); ttl < 12*3600+3600-1 || ttl >= 12*3600+4200 {
			t.Errorf("time to live %d s, want in [%d, %d)", ttl, 12*3600+3600-1, 12*3600+4200)
		}
		// A cost above what is left is refused alone; one that fits the
		// next period passes there, under a key of its own.
		clk.t = noon.Add(12 * time.Hour)
		r := ask(t, e.client, "tokengate", ours("daily", "k1", 5))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("the next day's first request of 5: %v, want OK with 0 left", r)
		}
		if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != 24*time.Hour {
			t.Errorf("the next day: duration_until_reset %v, want 24h", got)
		}
		if r := ask(t, e.client, "tokengate", ours("daily", "k2", 6)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("a cost of 6 under a limit of 5: %v, want OVER_LIMIT", r.OverallCode)
		}
	})
}

// TestQuotaLimitChanges: consumption is what is stored, so a limit raised
// or lowered mid-period (a new configuration) applies to the next
// request, and the precedence is override > identity (bounded by
// max_limit) > rule.
func TestQuotaLimitChanges(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, clk := startQuota(t, store, "3", noon)
	admitted := func(d *ratelimitv3.RateLimitDescriptor, n int) int {
		t.Helper()
		ok := 0
		for range n {
			if ask(t, e.client, "tokengate", d).OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if got := admitted(ours("daily", "a", 1), 5); got != 3 {
		t.Fatalf("limit 3: admitted %d of 5, want 3", got)
	}
	raise := func(limit string) {
		t.Helper()
		cfg, err := rls.ParseConfig([]byte(quotaConfig(limit)))
		if err != nil {
			t.Fatal(err)
		}
		e.srv.SetConfig(cfg)
		e.srv.SetClock(clk.now)
	}
	raise("8")
	if got := admitted(ours("daily", "a", 1), 10); got != 5 {
		t.Errorf("raised to 8 after 3: admitted %d of 10, want 5", got)
	}
	raise("4")
	r := ask(t, e.client, "tokengate", ours("daily", "a", 1))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("lowered to 4 after 8: %v, want OVER_LIMIT with 0 left", r)
	}
	if got := hget(t, srv, dayKey("a"), "u"); got != "8" {
		t.Errorf("consumption after the lowering: %q, want 8", got)
	}

	// Identity: min(value, max_limit 50); a value that is not a number
	// > 0 is ignored.
	for _, tc := range []struct {
		name, key, value string
		want             int
	}{
		{"identity below the bound", "i1", "7", 7},
		{"identity above the bound", "i2", "1000", 50},
		{"identity not a number", "i3", "lots", 4},
		{"identity zero", "i4", "0", 4},
		{"identity negative", "i5", "-3", 4},
	} {
		if got := admitted(withLimit("daily", tc.key, tc.value, 1), 60); got != tc.want {
			t.Errorf("%s (%s): admitted %d of 60, want %d", tc.name, tc.value, got, tc.want)
		}
	}
	// The override wins over the identity and the rule, at the next
	// request; without it the identity applies again.
	srv.MustDo("HSET", "ov:{daily:i1}", "limit", "9")
	if got := admitted(withLimit("daily", "i1", "7", 1), 5); got != 2 {
		t.Errorf("override 9 after 7: admitted %d of 5, want 2", got)
	}
	r = ask(t, e.client, "tokengate", withLimit("daily", "i1", "7", 1))
	if got, want := header(r, "ratelimit-policy"), `"daily";q=9;w=86400`; got != want {
		t.Errorf("under the override: RateLimit-Policy %q, want %q", got, want)
	}
	srv.MustDo("HSET", "ov:{daily:i1}", "limit", "0")
	if r := ask(t, e.client, "tokengate", ours("daily", "i1", 1)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("override 0: %v, want OVER_LIMIT", r.OverallCode)
	}
	srv.MustDo("DEL", "ov:{daily:i1}")
	srv.MustDo("HSET", "ov:{daily:a}", "limit", "100")
	if got := admitted(ours("daily", "a", 1), 3); got != 3 {
		t.Errorf("override 100 after 8: admitted %d of 3, want 3", got)
	}
}

// TestQuotaThresholds: a threshold's warning header and metric come once
// per period, on the request that crosses it first; the next period
// crosses it again.
func TestQuotaThresholds(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, clk := startQuota(t, store, "10", noon)
	crossed := func(pct string) float64 {
		t.Helper()
		v, err := e.m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range v {
			if mf.GetName() != "tokengate_rls_quota_threshold_crossed_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["rule"] == "daily" && labels["threshold"] == pct {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	for day := 0; day < 2; day++ {
		var warnings []string
		for i := 1; i <= 12; i++ {
			r := ask(t, e.client, "tokengate", ours("daily", "w", 1))
			if w := header(r, rls.WarningHeader); w != "" {
				warnings = append(warnings, strconv.Itoa(i)+":"+w)
			}
		}
		if got, want := strings.Join(warnings, " "), `5:"daily";t=50 8:"daily";t=80`; got != want {
			t.Errorf("day %d: warnings %q, want %q", day, got, want)
		}
		if got50, got80 := crossed("50"), crossed("80"); got50 != float64(day+1) || got80 != float64(day+1) {
			t.Errorf("day %d: crossed 50 %% %v times, 80 %% %v times, want %d each", day, got50, got80, day+1)
		}
		clk.t = clk.t.Add(24 * time.Hour)
	}
	// One request crossing both: the header names the highest.
	r := ask(t, e.client, "tokengate", ours("daily", "both", 9))
	if got, want := header(r, rls.WarningHeader), `"daily";t=80`; got != want {
		t.Errorf("a request of 9 of 10: warning %q, want %q", got, want)
	}
	if got := hget(t, srv, "qt:{daily:both}:"+strconv.FormatInt(time.Date(2026, 5, 5, 22, 0, 0, 0, time.UTC).Unix(), 10), "t"); got != "3" {
		t.Errorf("thresholds bitmask: %q, want 3", got)
	}
}

// TestQuotaAllOrNothing: a quota that admitted is given back when another
// rule of the request refuses, thresholds included, and a quota that
// refuses takes nothing from the bucket.
func TestQuotaAllOrNothing(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, _ := startQuota(t, store, "10", noon)
	for i := 1; i <= 4; i++ {
		r := ask(t, e.client, "tokengate", ours("daily", "g", 5), ours("bucket", "g", 1))
		wantOK := i <= 2
		if got := r.OverallCode == rlsv3.RateLimitResponse_OK; got != wantOK {
			t.Fatalf("request %d: %v, want OK %v", i, r.OverallCode, wantOK)
		}
		if !wantOK && header(r, rls.WarningHeader) != "" {
			t.Errorf("request %d: a refused request warns %q", i, header(r, rls.WarningHeader))
		}
	}
	// Two admitted (5 + 5); the quota is full, the bucket empty.
	if got := hget(t, srv, dayKey("g"), "u"); got != "10" {
		t.Errorf("consumption: %q, want 10", got)
	}
	srv.MustDo("DEL", "tb:{bucket:g}")
	srv.MustDo("HSET", dayKey("g"), "u", "4", "t", "0")
	// The bucket (burst 2) refuses a cost of 3: the quota's 5 and its
	// threshold bit (50 % of 10 at 9) are given back.
	r := ask(t, e.client, "tokengate", ours("daily", "g", 5), ours("bucket", "g", 3))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a bucket refusing: %v, want OVER_LIMIT", r.OverallCode)
	}
	if got, bits := hget(t, srv, dayKey("g"), "u"), hget(t, srv, dayKey("g"), "t"); got != "4" || bits != "0" {
		t.Errorf("after the refund: consumption %q, thresholds %q, want 4 and 0", got, bits)
	}
	r = ask(t, e.client, "tokengate", ours("daily", "g", 1))
	if got, want := header(r, rls.WarningHeader), `"daily";t=50`; got != want {
		t.Errorf("crossing 50 %% for real after the refund: warning %q, want %q", got, want)
	}
}

// TestQuotaSettle: a quota whose cost the response reports is charged
// after the response whatever its limit, refunded never below zero, and
// reset. The stream sends its receipt id, as the filter does: a refund
// gives back at most what the stream took and was charged
// (TestQuotaReceipts).
func TestQuotaSettle(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, clk := startQuota(t, store, "10", noon)
	client := withReceipt(e.client, "5555555555555555")
	// "monthly" (UTC, billing day 31): 2026-05-04 is in the period from
	// April 30 (April has 30 days) to May 31.
	key := "qt:{monthly:s}:" + strconv.FormatInt(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC).Unix(), 10)
	settle := func(ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, rlscontract.SettleHeader, "1")
		r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: ds})
		if err != nil {
			t.Fatalf("settlement: %v", err)
		}
		return r
	}
	if r := ask(t, client, "tokengate", ours("monthly", "s", 100)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("admission of the pre-charge: %v", r)
	}
	// The usage was 1 250 tokens: 1 150 more, above the limit of 1 000.
	r := settle(ours("monthly", "s", 1150))
	if got := hget(t, srv, key, "u"); got != "1250" {
		t.Fatalf("after a charge of 1150: %q, want 1250", got)
	}
	if r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("after the charge: remaining %d, want 0", r.Statuses[0].LimitRemaining)
	}
	if r := ask(t, e.client, "tokengate", ours("monthly", "s", 100)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("over the month's limit: %v, want OVER_LIMIT", r.OverallCode)
	}
	refund := func(amount string) {
		t.Helper()
		d := ours("monthly", "s", 0)
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rlscontract.SettleKey, Value: "refund"},
			&ratelimitv3.RateLimitDescriptor_Entry{Key: rlscontract.AmountKey, Value: amount})
		settle(d)
	}
	refund("300")
	if got := hget(t, srv, key, "u"); got != "950" {
		t.Errorf("after a refund of 300: %q, want 950", got)
	}
	refund("1000") // bounded by the limit, and by zero
	if got := hget(t, srv, key, "u"); got != "0" {
		t.Errorf("after a refund of 1000 from 950: %q, want 0 (never below)", got)
	}
	// A settlement after the period's end goes to the next period.
	clk.t = time.Date(2026, 5, 31, 0, 0, 1, 0, time.UTC)
	settle(&ratelimitv3.RateLimitDescriptor{Entries: ours("monthly", "s", 0).Entries, HitsAddend: wrapperspb.UInt64(7)})
	next := "qt:{monthly:s}:" + strconv.FormatInt(time.Date(2026, 5, 31, 0, 0, 0, 0, time.UTC).Unix(), 10)
	if got := hget(t, srv, next, "u"); got != "7" {
		t.Errorf("a charge in the next period: %q, want 7 under %s", got, next)
	}
}

// TestTokenBucketOverride: a cluster token bucket's override (rate,
// burst) applies at the next request.
func TestTokenBucketOverride(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, _ := startQuota(t, store, "10", noon)
	srv.MustDo("HSET", "ov:{bucket:o}", "burst", "5")
	ok := 0
	for range 7 {
		if ask(t, e.client, "tokengate", ours("bucket", "o", 1)).OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 5 {
		t.Errorf("burst overridden to 5 (rule: 2): admitted %d of 7, want 5", ok)
	}
	// Not numbers > 0: the rule's.
	srv.MustDo("HSET", "ov:{bucket:p}", "burst", "-1", "rate", "x")
	ok = 0
	for range 4 {
		if ask(t, e.client, "tokengate", ours("bucket", "p", 1)).OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 2 {
		t.Errorf("a bad override: admitted %d of 4, want the rule's 2", ok)
	}
}

// TestQuotaRedisRestart: with the append-only file, a Redis stopped and
// started again on its directory keeps the period's consumption.
func TestQuotaRedisRestart(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, _ := startQuota(t, store, "5", noon)
	for i := range 3 {
		if r := ask(t, e.client, "tokengate", ours("daily", "r", 1)); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, r.OverallCode)
		}
	}
	srv.MustDo("HSET", "ov:{daily:r}", "limit", "4")
	srv.Stop()
	srv.Restart()
	if got := hget(t, srv, dayKey("r"), "u"); got != "3" {
		t.Fatalf("after the restart: consumption %q, want 3", got)
	}
	var codes []string
	deadline := time.Now().Add(10 * time.Second)
	for len(codes) < 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("daily", "r", 1)}})
		cancel()
		if err != nil {
			// The store reconnects to the new process.
			if time.Now().After(deadline) {
				t.Fatalf("no answer after the restart: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		codes = append(codes, r.OverallCode.String())
	}
	// The override survived too: 3 + 1 = 4 is its limit.
	if got, want := strings.Join(codes, " "), "OK OVER_LIMIT"; got != want {
		t.Errorf("after the restart: %s, want %s", got, want)
	}
}

// TestQuotaUsage: Usage reads a key's consumption, the limit that applies
// and the period without changing them; an override shows as its source.
func TestQuotaUsage(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, _ := startQuota(t, store, "5", noon)
	for range 3 {
		ask(t, e.client, "tokengate", ours("daily", "u", 1))
	}
	ctx := context.Background()
	for range 2 { // reading twice changes nothing
		u, err := e.srv.Usage(ctx, "daily", "u")
		if err != nil {
			t.Fatal(err)
		}
		want := rls.Usage{Rule: "daily", Key: "u", Period: "day", Used: 3, Limit: 5, Remaining: 2,
			PeriodStart: time.Date(2026, 5, 3, 22, 0, 0, 0, time.UTC), Reset: time.Date(2026, 5, 4, 22, 0, 0, 0, time.UTC), Source: rls.SourceRule}
		if !u.PeriodStart.Equal(want.PeriodStart) || !u.Reset.Equal(want.Reset) {
			t.Errorf("period: got [%v, %v), want [%v, %v)", u.PeriodStart, u.Reset, want.PeriodStart, want.Reset)
		}
		u.PeriodStart, u.Reset, want.PeriodStart, want.Reset = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if u != want {
			t.Errorf("usage: got %+v, want %+v", u, want)
		}
	}
	srv.MustDo("HSET", "ov:{daily:u}", "limit", "2")
	u, err := e.srv.Usage(ctx, "daily", "u")
	if err != nil || u.Limit != 2 || u.Remaining != 0 || u.Source != rls.SourceOverride || u.Source.String() != "override" {
		t.Errorf("under an override of 2: %+v %v, want limit 2, remaining 0, source override", u, err)
	}
	if u, err := e.srv.Usage(ctx, "daily", "never-seen"); err != nil || u.Used != 0 || u.Limit != 5 {
		t.Errorf("a key never seen: %+v %v, want used 0 of 5", u, err)
	}
	if _, err := e.srv.Usage(ctx, "bucket", "u"); err != rls.ErrNotQuota {
		t.Errorf("a token bucket rule: %v, want ErrNotQuota", err)
	}
	if got := hget(t, srv, dayKey("u"), "u"); got != "3" {
		t.Errorf("after reads: consumption %q, want 3", got)
	}
}

// TestQuotaHammer: 32 callers on two service replicas sharing one Redis
// ask for one key at once: exactly the limit is admitted, and exactly
// that is counted.
func TestQuotaHammer(t *testing.T) {
	srv := redistest.Start(t)
	e1, _ := startQuota(t, newStore(t, []string{srv.Addr}, false, 2*time.Second), "100", noon)
	e2, _ := startQuota(t, newStore(t, []string{srv.Addr}, false, 2*time.Second), "100", noon)
	const callers, each = 32, 8
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := e1.client
			if c%2 == 1 {
				client = e2.client
			}
			for range each {
				if r := askGo(t, client, "tokengate", ours("daily", "hammer", 1)); r != nil && r.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 100 {
		t.Errorf("admitted %d of %d, want exactly the limit, 100", got, callers*each)
	}
	if got := hget(t, srv, dayKey("hammer"), "u"); got != "100" {
		t.Errorf("consumption %q, want 100", got)
	}
}

// TestQuotaUnknownZone: the service refuses a configuration whose quota
// names a zone its database does not know, naming the rule and the field.
func TestQuotaUnknownZone(t *testing.T) {
	for _, zone := range []string{"Mars/Olympus", "Local", "europe/paris"} {
		cfg := strings.Replace(quotaConfig("5"), `"Europe/Paris"`, strconv.Quote(zone), 1)
		_, err := rls.ParseConfig([]byte(cfg))
		want := `rule "daily": algorithm_config.time_zone: unknown time zone ` + strconv.Quote(zone) + `, want an IANA name such as "Europe/Paris" or "UTC"`
		if err == nil || err.Error() != want {
			t.Errorf("zone %q: got %v, want %q", zone, err, want)
		}
	}
	if _, err := rls.ParseConfig([]byte(quotaConfig("5"))); err != nil {
		t.Errorf("Europe/Paris: %v", err)
	}
}

// TestQuotaReceipts: through the service, a quota's settlements give
// back only what the settling stream consumed in the period and was not
// given back (docs/rls.md#receipts). Streams A and B take 100 each of
// key s ("monthly", pre_charge 100) and C 100 of key t; refunds and
// resets with no id, an id that took nothing, an invalid id or C's id
// (which took from another key) give nothing back; A's refund of 1000
// gives back its 100, once; B's charge adds to its receipt and B's reset
// gives back B's 100 + 50 only, not A's or anyone's; a take given back
// because another rule refused its call leaves no receipt; and a refund
// that lands in the next period gives nothing back in either period.
// Before quota receipts each forged refund lowered the consumption, down
// to 0.
func TestQuotaReceipts(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, clk := startQuota(t, store, "10", noon)
	start := strconv.FormatInt(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC).Unix(), 10)
	key := "qt:{monthly:s}:" + start
	a, b, c := withReceipt(e.client, "aaaaaaaaaaaaaaa1"), withReceipt(e.client, "bbbbbbbbbbbbbbb2"), withReceipt(e.client, "ccccccccccccccc3")
	for _, adm := range []struct {
		c   rlsv3.RateLimitServiceClient
		key string
	}{{a, "s"}, {b, "s"}, {c, "t"}} {
		if r := ask(t, adm.c, "tokengate", ours("monthly", adm.key, 100)); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("admission: %v", r)
		}
	}
	reset := settleDesc("monthly", "s", rlscontract.SettleKey, "reset")
	steps := []struct {
		name string
		c    rlsv3.RateLimitServiceClient
		d    *ratelimitv3.RateLimitDescriptor
		used string
	}{
		{"a refund without a receipt id", e.client, refundDesc("monthly", "s", "1000"), "200"},
		{"a refund with an id that took nothing", withReceipt(e.client, "ddddddddddddddd4"), refundDesc("monthly", "s", "1000"), "200"},
		{"a refund with an invalid id", withReceipt(e.client, "short"), refundDesc("monthly", "s", "1000"), "200"},
		{"a refund with the id of a stream of another key", c, refundDesc("monthly", "s", "1000"), "200"},
		{"a reset without a receipt id", e.client, reset, "200"},
		{"a reset with an id that took nothing", withReceipt(e.client, "ddddddddddddddd4"), reset, "200"},
		{"a reset with the id of a stream of another key", c, reset, "200"},
		{"A's refund of 1000 gives its 100", a, refundDesc("monthly", "s", "1000"), "100"},
		{"A's refund again gives nothing", a, refundDesc("monthly", "s", "1000"), "100"},
		{"B's charge of 50 adds to its receipt", b, ours("monthly", "s", 50), "150"},
		{"a charge without an id applies", e.client, ours("monthly", "s", 30), "180"},
		{"B's reset gives back its 150 only", b, reset, "30"},
		{"B's reset again gives nothing", b, reset, "30"},
	}
	for _, st := range steps {
		if err := settleCall(st.c, st.d); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := hget(t, srv, key, "u"); got != st.used {
			t.Fatalf("%s: consumption %s, want %s", st.name, got, st.used)
		}
	}
	if got := hget(t, srv, "qt:{monthly:t}:"+start, "u"); got != "100" {
		t.Errorf("key t: consumption %s, want C's 100 untouched", got)
	}
	if n, _ := srv.Do("EXISTS", key+":r:aaaaaaaaaaaaaaa1", key+":r:bbbbbbbbbbbbbbb2", key+":r:-"); n != int64(0) {
		t.Errorf("receipts given back in full: %v keys left, want 0", n)
	}

	// All or nothing: the bucket (burst 2) refuses 3, the quota's take
	// is given back and leaves no receipt; its refund then gives nothing.
	f := withReceipt(e.client, "fffffffffffffff6")
	if r := ask(t, f, "tokengate", ours("monthly", "s", 100), ours("bucket", "s", 3)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("over the limit on bucket: %v", r)
	}
	if got := hget(t, srv, key, "u"); got != "30" {
		t.Errorf("after the all-or-nothing refund: consumption %s, want 30", got)
	}
	if n, _ := srv.Do("EXISTS", key+":r:fffffffffffffff6"); n != int64(0) {
		t.Errorf("a take given back kept its receipt")
	}
	if err := settleCall(f, refundDesc("monthly", "s", "100")); err != nil {
		t.Fatal(err)
	}
	if got := hget(t, srv, key, "u"); got != "30" {
		t.Errorf("a refund of a take given back: consumption %s, want 30", got)
	}

	// The period boundary: G takes 100 in May's period; its settlements
	// land in June's, where its refund and reset find no receipt (they
	// give back neither May's 100 nor June's other usage) and its charge
	// applies.
	g := withReceipt(e.client, "ggggggggggggggg7")
	if r := ask(t, g, "tokengate", ours("monthly", "s", 100)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("G's admission: %v", r)
	}
	clk.t = time.Date(2026, 5, 31, 0, 0, 1, 0, time.UTC)
	next := "qt:{monthly:s}:" + strconv.FormatInt(time.Date(2026, 5, 31, 0, 0, 0, 0, time.UTC).Unix(), 10)
	if r := ask(t, e.client, "tokengate", ours("monthly", "s", 100)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("another stream in June: %v", r)
	}
	for _, d := range []*ratelimitv3.RateLimitDescriptor{refundDesc("monthly", "s", "1000"), reset} {
		if err := settleCall(g, d); err != nil {
			t.Fatal(err)
		}
	}
	if old, now := hget(t, srv, key, "u"), hget(t, srv, next, "u"); old != "130" || now != "100" {
		t.Errorf("after G's refund and reset across the boundary: May %s, June %s, want 130 and 100", old, now)
	}
	if err := settleCall(g, ours("monthly", "s", 7)); err != nil {
		t.Fatal(err)
	}
	if old, now := hget(t, srv, key, "u"), hget(t, srv, next, "u"); old != "130" || now != "107" {
		t.Errorf("after G's charge across the boundary: May %s, June %s, want 130 and 107", old, now)
	}
}

// TestQuotaReceiptsHammer: streams of an authenticated proxy at once on
// one quota key ("monthly", limit 1,000, no refill within a period).
// Honest streams take 5 and give 2 back (they keep 3); greedy ones take 5
// and ask for 50 back three times (they keep 0); forgers ask for 100 back
// and reset with no receipt id, an id that took nothing, or an id never
// sent. The period's consumption ends at exactly 3 × the honest
// admissions: forged refunds gave nothing back, greedy ones only what
// their stream took, and no receipt was counted twice.
func TestQuotaReceiptsHammer(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, 2*time.Second)
	e, _ := startQuota(t, store, "10", noon)
	key := "qt:{monthly:h}:" + strconv.FormatInt(time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC).Unix(), 10)

	var honest, greedy atomic.Int64
	var ids atomic.Int64
	nextID := func() string { return strconv.FormatInt(1e15+ids.Add(1), 16) }
	reset := settleDesc("monthly", "h", rlscontract.SettleKey, "reset")
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				switch w % 3 {
				case 0, 1: // honest (0) and greedy (1) streams
					c := withReceipt(e.client, nextID())
					r := askGo(t, c, "tokengate", ours("monthly", "h", 5))
					if r == nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
						t.Errorf("an admission: %v", r)
						continue
					}
					if w%3 == 0 {
						if err := settleCall(c, refundDesc("monthly", "h", "2")); err != nil {
							t.Errorf("an honest refund: %v", err)
							continue
						}
						honest.Add(1)
						continue
					}
					for range 3 {
						if err := settleCall(c, refundDesc("monthly", "h", "50")); err != nil {
							t.Errorf("a greedy refund: %v", err)
						}
					}
					greedy.Add(1)
				default: // forgers
					id := [...]string{"", "0000000000000000", nextID()}[i%3]
					_ = settleCall(withReceipt(e.client, id), refundDesc("monthly", "h", "100"))
					_ = settleCall(withReceipt(e.client, id), reset)
				}
			}
		}()
	}
	wg.Wait()
	if honest.Load() != 4*30 || greedy.Load() != 4*30 {
		t.Fatalf("%d honest and %d greedy streams completed, want 120 each", honest.Load(), greedy.Load())
	}
	if got, want := hget(t, srv, key, "u"), strconv.FormatInt(3*honest.Load(), 10); got != want {
		t.Errorf("consumption %s, want %s (3 per honest stream, 0 per greedy one)", got, want)
	}
	if keys, _ := srv.Do("KEYS", key+":r:*"); len(keys.([]any)) != 4*30 {
		t.Errorf("%d receipts left, want one of 3 per honest stream (120)", len(keys.([]any)))
	}
}
