// Package ratelimitheader formats the RateLimit response headers, after
// draft-ietf-httpapi-ratelimit-headers-09, for both the filter and the
// rate-limit service, so that a client sees the same bytes from either:
//
//	RateLimit: "per-ip";r=9;t=1, "per-key";r=99;t=1
//	RateLimit-Policy: "per-ip";q=10;w=2, "per-key";q=100;w=1
//
// one list member per enforced rule that applied, in configuration order
// (shadow rules never show). r is the whole tokens left in that rule's
// bucket; t is, on an admitted request, the seconds until the bucket is
// full again and, on a rejected one, the seconds until this request could
// pass that bucket. The legacy RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset describe one rule: the one with the fewest tokens left,
// or on a rejection the rule that rejected. docs/headers.md has the rest.
//
// Every seconds value a header states goes through Seconds. The append
// functions allocate nothing when dst has room: the package runs inside the
// wasm guest, where an allocation costs hundreds of nanoseconds (it uses
// strconv, never fmt).
package ratelimitheader

import (
	"math"
	"strconv"

	"github.com/tokengate/tokengate/bucket"
)

// MaxSeconds caps the seconds a header states: a rate of 1e-9 tokens a
// second would otherwise overflow int64 (about 34 years).
const MaxSeconds = 1 << 30

// Seconds rounds a duration in seconds up to whole seconds, within [0,
// MaxSeconds]; NaN and non-positive durations are 0.
func Seconds(d float64) int64 {
	if !(d > 0) {
		return 0
	}
	if d >= MaxSeconds {
		return MaxSeconds
	}
	return int64(math.Ceil(d))
}

// Plan is what the headers say about one rule that does not depend on the
// request, formatted once per configuration.
type Plan struct {
	_ incomparable
	// wire holds, outside the wasm guest, the bytes of the response
	// headers that do not depend on the request, for AppendHeaders
	// (PrepareHeaders, wire_native.go); in the guest it is empty, and
	// takes no room.
	wire wire
	// Limit is the RateLimit-Limit value: the whole tokens of a full
	// bucket, or a fixed window's limit per window.
	Limit string
	// Policy is the rule's RateLimit-Policy member,
	// "<rule>";q=<limit>;w=<seconds>.
	Policy string
	// Quoted is the rule name as a quoted string, the first field of its
	// RateLimit and RateLimit-Policy members.
	Quoted string
	// window is set for a fixed window, whose r is stated at most as its
	// limit, maxRemaining (q): tokens rolled over up to a larger capacity
	// would exceed it. A token bucket's tokens never exceed its limit.
	window       bool
	maxRemaining int64
}

// NewPlan returns the plan of the rule called name with limit l. w is the
// seconds an empty bucket takes to fill (l.FillTime()), or a fixed window's
// length.
func NewPlan(name string, l bucket.Limit) Plan {
	limit := strconv.FormatInt(int64(l.Burst), 10)
	window := Seconds(l.FillTime())
	var maxRemaining int64
	if l.Window > 0 {
		// A fixed window's quota is its limit per window. Capacity may
		// let unused tokens roll over beyond it; r never states more than
		// the quota, so that r <= q holds in every header.
		limit, window = strconv.FormatInt(int64(l.Rate), 10), Seconds(l.Window)
		maxRemaining = int64(l.Rate)
	}
	quoted := strconv.Quote(name)
	return Plan{
		Limit:        limit,
		Policy:       quoted + ";q=" + limit + ";w=" + strconv.FormatInt(window, 10),
		Quoted:       quoted,
		window:       l.Window > 0,
		maxRemaining: maxRemaining,
	}
}

// Quota is what the headers say about one bucket for one request.
type Quota struct {
	// Plan is the bucket's rule's plan.
	Plan *Plan
	// Remaining is the whole tokens left in the bucket (r); a fixed
	// window's is stated at most as its limit.
	Remaining int64
	// Reset is the seconds t states (see the package comment), already
	// through Seconds.
	Reset int64
}

// Stated is the r the headers state for q: its Remaining, at most its
// fixed window's limit. AppendFields states it; so does filter/dynmod,
// which formats the headers straight into its mailbox.
func Stated(q *Quota) int64 {
	if q.Plan.window {
		return min(q.Remaining, q.Plan.maxRemaining)
	}
	return q.Remaining
}

// Fields locates the header values AppendFields formatted, as [from, to)
// offsets in its buffer.
type Fields struct {
	// List is the RateLimit value and Policy the RateLimit-Policy value.
	List, Policy [2]int
	// Remaining and Reset are the legacy RateLimit-Remaining and
	// RateLimit-Reset values: the numbers of the best quota's member.
	Remaining, Reset [2]int
}

// AppendMember appends one RateLimit list member,
// <quoted>;r=<remaining>;t=<reset>, to dst, and returns where its two
// numbers are.
func AppendMember(dst []byte, quoted string, remaining, reset int64) (b []byte, r, t [2]int) {
	dst = append(dst, quoted...)
	dst = append(dst, ";r="...)
	r[0] = len(dst)
	dst = AppendCount(dst, remaining)
	r[1] = len(dst)
	dst = append(dst, ";t="...)
	t[0] = len(dst)
	dst = AppendCount(dst, reset)
	t[1] = len(dst)
	return dst, r, t
}

// AppendFields appends the RateLimit and RateLimit-Policy values of quotas
// to b, list first; best indexes the quota the legacy headers describe,
// whose RateLimit-Limit is quotas[best].Plan.Limit.
func AppendFields(b []byte, quotas []Quota, best int) ([]byte, Fields) {
	var f Fields
	f.List[0] = len(b)
	for i := range quotas {
		if i > 0 {
			b = append(b, ", "...)
		}
		var r, t [2]int
		b, r, t = AppendMember(b, quotas[i].Plan.Quoted, Stated(&quotas[i]), quotas[i].Reset)
		if i == best {
			f.Remaining, f.Reset = r, t
		}
	}
	f.List[1] = len(b)
	f.Policy[0] = len(b)
	for i := range quotas {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, quotas[i].Plan.Policy...)
	}
	f.Policy[1] = len(b)
	return b, f
}

// AppendCount appends v in decimal, as strconv.AppendInt(dst, v, 10) does.
// Values in [0, 2^32), every count a header states but a burst beyond
// four billion, are written in place with 32-bit divisions: in the wasm
// guest strconv's path costs several calls and a copy through memmove.
func AppendCount(dst []byte, v int64) []byte {
	if v < 0 || v >= 1<<32 {
		return strconv.AppendInt(dst, v, 10)
	}
	u := uint32(v)
	n := 1
	for x := u; x >= 10; x /= 10 {
		n++
	}
	l := len(dst)
	if cap(dst)-l < n {
		dst = append(dst, "0000000000"[:n]...)
	}
	dst = dst[:l+n]
	for i := l + n - 1; i > l; i-- {
		dst[i] = byte('0' + u%10)
		u /= 10
	}
	dst[l] = byte('0' + u)
	return dst
}

// incomparable is a zero-width field that makes a struct not comparable
// (as net/http's): the compiler then generates no equality function for
// it, which the wasm module would carry (a few hundred bytes each, with its
// function table entries) though nothing compares the struct. Put it first:
// last, a zero-width field adds padding.
type incomparable [0]func()
