//go:build !wasip1

package dynmod

import (
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/ratelimitheader"
)

// TestSetRateLimitHeaders: the headers the binding formats itself, into
// the mailbox or into the queue, are the bytes the filter would set from
// ratelimitheader.AppendFields, in its order (three set, two added), for
// one rule and for several (a fixed window's r capped at its limit); a
// mailbox they do not fit is left as it was and marked full.
func TestSetRateLimitHeaders(t *testing.T) {
	bucketPlan := ratelimitheader.NewPlan("per-ip", bucket.Limit{Rate: 10, Burst: 20})
	windowPlan := ratelimitheader.NewPlan("per-key", bucket.Limit{Rate: 100, Burst: 300, Window: 60})
	tests := []struct {
		name   string
		quotas []ratelimitheader.Quota
		best   int
	}{
		{"one rule", []ratelimitheader.Quota{{Plan: &bucketPlan, Remaining: 19, Reset: 1}}, 0},
		{"two rules", []ratelimitheader.Quota{{Plan: &bucketPlan, Remaining: 7, Reset: 2}, {Plan: &windowPlan, Remaining: 250, Reset: 31}}, 1},
		{"large values", []ratelimitheader.Quota{{Plan: &bucketPlan, Remaining: 1 << 40, Reset: ratelimitheader.MaxSeconds}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, f := ratelimitheader.AppendFields(nil, tc.quotas, tc.best)
			want := []struct {
				add         uint32
				name, value string
			}{
				{0, "ratelimit-limit", tc.quotas[tc.best].Plan.Limit},
				{0, "ratelimit-remaining", string(b[f.Remaining[0]:f.Remaining[1]])},
				{0, "ratelimit-reset", string(b[f.Reset[0]:f.Reset[1]])},
				{1, "ratelimit", string(b[f.List[0]:f.List[1]])},
				{1, "ratelimit-policy", string(b[f.Policy[0]:f.Policy[1]])},
			}
			check := func(where string, buf []byte, ops []uint32) {
				t.Helper()
				if len(ops) != 3*len(want) {
					t.Fatalf("%s: got %d ops, want %d", where, len(ops)/3, len(want))
				}
				off := uint32(0)
				for i, w := range want {
					add, kl, vl := ops[3*i], ops[3*i+1], ops[3*i+2]
					name, value := string(buf[off:off+kl]), string(buf[off+kl:off+kl+vl])
					if add != w.add || name != w.name || value != w.value {
						t.Errorf("%s: header %d got %d %q %q, want %d %q %q", where, i, add, name, value, w.add, w.name, w.value)
					}
					off += kl + vl
				}
				if int(off) != len(buf) {
					t.Errorf("%s: got %d bytes, headers use %d", where, len(buf), off)
				}
			}

			// The queue (no mailbox): after what an earlier header queued.
			h := &whost{w: &worker{cur: 1}}
			h.queueHeader(false, "x-before", "1")
			h.SetRateLimitHeaders(tc.quotas, tc.best)
			if h.pendOps[0] != 0 || string(h.pendBuf[:9]) != "x-before1" {
				t.Fatalf("queue: the earlier header was lost: %q", h.pendBuf)
			}
			check("queue", h.pendBuf[9:], h.pendOps[3:])

			// The mailbox, after one header already in it.
			var box Mailbox
			h = &whost{w: &worker{cur: 1}, box: &box}
			h.queueHeader(false, "x-before", "1")
			h.SetRateLimitHeaders(tc.quotas, tc.best)
			if h.boxFull || box.NHeaders != 6 {
				t.Fatalf("mailbox: full %v, %d headers, want 6", h.boxFull, box.NHeaders)
			}
			check("mailbox", box.Buf[9:box.BufLen], box.Ops[3:3*box.NHeaders])

			// A mailbox with too few headers left, or too few bytes.
			for _, fill := range []struct{ n, bytes uint32 }{{MailboxHeaders - 4, 10}, {1, MailboxBytes - 60}} {
				box = Mailbox{NHeaders: fill.n, BufLen: fill.bytes}
				h = &whost{w: &worker{cur: 1}, box: &box}
				h.SetRateLimitHeaders(tc.quotas, tc.best)
				if !h.boxFull || box.NHeaders != fill.n || box.BufLen != fill.bytes {
					t.Errorf("full mailbox %v: got full %v, %d headers, %d bytes; want full, unchanged", fill, h.boxFull, box.NHeaders, box.BufLen)
				}
			}
		})
	}
}
