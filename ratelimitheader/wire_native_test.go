//go:build !wasip1

package ratelimitheader

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

// header is one header AppendHeaders wrote: set or added, name, value.
type header struct {
	add         uint32
	name, value string
}

// decode splits AppendHeaders' bytes by its ops, checking that they add up.
func decode(t *testing.T, buf []byte, ops []uint32) []header {
	t.Helper()
	if len(ops)%3 != 0 {
		t.Fatalf("%d ops, not whole headers", len(ops))
	}
	var hs []header
	off := uint32(0)
	for i := 0; i < len(ops); i += 3 {
		add, kl, vl := ops[i], ops[i+1], ops[i+2]
		if int(off+kl+vl) > len(buf) {
			t.Fatalf("header %d runs past the %d bytes", i/3, len(buf))
		}
		hs = append(hs, header{add, string(buf[off : off+kl]), string(buf[off+kl : off+kl+vl])})
		off += kl + vl
	}
	if int(off) != len(buf) {
		t.Fatalf("headers use %d bytes of %d", off, len(buf))
	}
	return hs
}

// want is what the filter sets from AppendFields (filter's
// setRateLimitHeaders): three set, two added.
func want(quotas []Quota, best int) []header {
	b, f := AppendFields(nil, quotas, best)
	return []header{
		{0, "ratelimit-limit", quotas[best].Plan.Limit},
		{0, "ratelimit-remaining", string(b[f.Remaining[0]:f.Remaining[1]])},
		{0, "ratelimit-reset", string(b[f.Reset[0]:f.Reset[1]])},
		{1, "ratelimit", string(b[f.List[0]:f.List[1]])},
		{1, "ratelimit-policy", string(b[f.Policy[0]:f.Policy[1]])},
	}
}

// TestAppendHeaders: the headers AppendHeaders writes are AppendFields'
// values under the filter's names, in its order, for prepared plans (one
// quota: the copied bytes) and plans not prepared (formatted in full), one
// quota and several, token buckets and fixed windows (r capped at the
// limit), every digit count and the values beyond the 32-bit fast path;
// after bytes and ops already there, into a buffer with room and one
// without.
func TestAppendHeaders(t *testing.T) {
	limits := []bucket.Limit{
		{Rate: 10, Burst: 20},
		{Rate: 1000000, Burst: 1000000},
		{Rate: 0.001, Burst: 3},
		{Rate: 100, Burst: 300, Window: 60},
		{Rate: 5, Burst: 5, Window: 1},
		{Rate: 1e12, Burst: 1e12},
	}
	names := []string{"per-ip", "r", `quote"d \ name`, "a-rather-long-rule-name-0123456789"}
	var plans []*Plan
	for i, l := range limits {
		for j, n := range names {
			p := NewPlan(n+strconv.Itoa(i), l)
			if (i+j)%3 != 0 {
				p.PrepareHeaders()
			}
			plans = append(plans, &p)
		}
	}
	counts := []int64{0, 1, 9, 10, 99, 100, 299, 300, 301, 999999, 1000000, 1 << 30, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64, -1}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func() int64 {
		if rng.IntN(2) == 0 {
			return counts[rng.IntN(len(counts))]
		}
		return rng.Int64N(1 << uint(rng.IntN(40)+1))
	}
	check := func(quotas []Quota, best int) {
		t.Helper()
		w := want(quotas, best)
		for _, room := range []int{0, 2048} {
			buf := append(make([]byte, 0, room), "x-before1"...)
			ops := append(make([]uint32, 0, room/64), 0, 8, 1)
			buf, ops = AppendHeaders(buf, ops, quotas, best)
			got := decode(t, buf, ops)
			if got[0] != (header{0, "x-before", "1"}) {
				t.Fatalf("the earlier header was lost: %v", got[0])
			}
			got = got[1:]
			if len(got) != len(w) {
				t.Fatalf("%v best %d: %d headers, want %d", quotas, best, len(got), len(w))
			}
			for i := range w {
				if got[i] != w[i] {
					t.Errorf("quotas %v best %d room %d: header %d got %q, want %q", quotas, best, room, i, got[i], w[i])
				}
			}
		}
	}
	for _, p := range plans {
		for _, r := range counts {
			for _, reset := range []int64{0, 1, 9, 10, 61, MaxSeconds} {
				check([]Quota{{Plan: p, Remaining: r, Reset: reset}}, 0)
			}
		}
	}
	for range 2000 {
		n := 1 + rng.IntN(4)
		quotas := make([]Quota, n)
		for i := range quotas {
			quotas[i] = Quota{Plan: plans[rng.IntN(len(plans))], Remaining: pick(), Reset: pick()}
		}
		check(quotas, rng.IntN(n))
	}
}

// TestPrepareHeaders: a prepared plan's request bytes are its Limit, Quoted
// and Policy under the header names; a plan not prepared has none, and
// AppendHeaders formats it in full (TestAppendHeaders compares both).
func TestPrepareHeaders(t *testing.T) {
	p := NewPlan("per-ip", bucket.Limit{Rate: 10, Burst: 20})
	if p.wire != (wire{}) {
		t.Fatalf("NewPlan prepared %+v, want nothing until PrepareHeaders", p.wire)
	}
	p.PrepareHeaders()
	w := wire{head: "ratelimit-limit20ratelimit-remaining", member: `ratelimit"per-ip";r=`, policy: `ratelimit-policy"per-ip";q=20;w=2`}
	if p.wire != w {
		t.Fatalf("PrepareHeaders: got %+v, want %+v", p.wire, w)
	}
}

// TestAppendOneDigits: the digits appendOne writes into both places of r
// and of t are AppendFields' (AppendCount's), and countDigits counts them,
// for every power of ten and its neighbours, the 32-bit ends and random
// values, as r and as t, into a buffer with room (appendOne's own path).
func TestAppendOneDigits(t *testing.T) {
	vals := []int64{0, 1, 9, math.MaxUint32, math.MaxUint32 - 1}
	for p := int64(1); p <= math.MaxUint32; p *= 10 {
		vals = append(vals, p-1, p, p+1, 2*p-1, 2*p)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		vals = append(vals, int64(rng.Uint32()>>uint(rng.IntN(32))))
	}
	plan := NewPlan("per-ip", bucket.Limit{Rate: 1e9, Burst: 1e10})
	plan.PrepareHeaders()
	buf, ops := make([]byte, 0, 1024), make([]uint32, 0, 16)
	for i, v := range vals {
		if n := countDigits(uint32(v)); n != len(strconv.FormatInt(v, 10)) {
			t.Fatalf("countDigits(%d) = %d", v, n)
		}
		other := vals[(i*7919)%len(vals)]
		for _, q := range []Quota{{Plan: &plan, Remaining: v, Reset: other}, {Plan: &plan, Remaining: other, Reset: v}} {
			quotas := []Quota{q}
			b, o := AppendHeaders(buf[:0], ops[:0], quotas, 0)
			if &b[0] != &buf[:1][0] {
				t.Fatalf("r %d t %d: the buffer with room was replaced", q.Remaining, q.Reset)
			}
			got, w := decode(t, b, o), want(quotas, 0)
			for k := range w {
				if got[k] != w[k] {
					t.Fatalf("r %d t %d: header %d got %q, want %q", q.Remaining, q.Reset, k, got[k], w[k])
				}
			}
		}
	}
}
