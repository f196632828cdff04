//go:build !wasip1

package ratelimitheader

import "math/bits"

// The RateLimit response headers of an admitted request, as the filter
// sets them and AppendHeaders writes them: the legacy three set (replacing
// the upstream's), then RateLimit and RateLimit-Policy added (see
// AppendFields).
const (
	nameLimit     = "ratelimit-limit"
	nameRemaining = "ratelimit-remaining"
	nameReset     = "ratelimit-reset"
	nameList      = "ratelimit"
	namePolicy    = "ratelimit-policy"
)

// wire is what AppendHeaders copies as it is for a request with one quota:
// the header bytes of a plan that do not depend on the request, formatted
// once by PrepareHeaders.
type wire struct {
	// head is the RateLimit-Limit header, name then value, followed by
	// the name of RateLimit-Remaining.
	head string
	// member is the name of RateLimit followed by the start of the plan's
	// member, <quoted>;r=.
	member string
	// policy is the RateLimit-Policy header, name then value, for a
	// request with this plan's quota alone.
	policy string
}

// PrepareHeaders formats the bytes of p's headers that do not depend on
// the request, once, so that AppendHeaders copies them for a request with
// p's quota alone instead of formatting them; it must be called when p's
// fields are final. A plan not prepared is formatted in full, as
// AppendFields does. It is a no-op in the wasm guest, whose binding does
// not use AppendHeaders.
func (p *Plan) PrepareHeaders() {
	p.wire = wire{
		head:   nameLimit + p.Limit + nameRemaining,
		member: nameList + p.Quoted + ";r=",
		policy: namePolicy + p.Policy,
	}
}

// AppendHeaders appends the five RateLimit headers of an admitted request
// with quotas to buf, each name followed by its value, and to ops the
// {add (1) or set (0), name length, value length} of each, in the order
// the filter sets them: RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset set, then RateLimit and RateLimit-Policy added. The
// values are AppendFields' bytes (quotas[best]'s legacy three), written
// from prepared plans (PrepareHeaders) when the request has one quota.
func AppendHeaders(buf []byte, ops []uint32, quotas []Quota, best int) ([]byte, []uint32) {
	if len(quotas) == 1 && quotas[0].Plan.wire.head != "" {
		return appendOne(buf, ops, &quotas[0])
	}
	q := &quotas[best]
	buf = append(buf, nameLimit...)
	v := len(buf)
	buf = append(buf, q.Plan.Limit...)
	ops = append(ops, 0, uint32(len(nameLimit)), uint32(len(buf)-v))
	buf = append(buf, nameRemaining...)
	v = len(buf)
	buf = AppendCount(buf, Stated(q))
	ops = append(ops, 0, uint32(len(nameRemaining)), uint32(len(buf)-v))
	buf = append(buf, nameReset...)
	v = len(buf)
	buf = AppendCount(buf, q.Reset)
	ops = append(ops, 0, uint32(len(nameReset)), uint32(len(buf)-v))
	buf = append(buf, nameList...)
	v = len(buf)
	for i := range quotas {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf, _, _ = AppendMember(buf, quotas[i].Plan.Quoted, Stated(&quotas[i]), quotas[i].Reset)
	}
	ops = append(ops, 1, uint32(len(nameList)), uint32(len(buf)-v))
	buf = append(buf, namePolicy...)
	v = len(buf)
	for i := range quotas {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(buf, quotas[i].Plan.Policy...)
	}
	ops = append(ops, 1, uint32(len(namePolicy)), uint32(len(buf)-v))
	return buf, ops
}

// appendOne is AppendHeaders for one quota of a prepared plan: the fixed
// bytes are copied, and r and t, each formatted once, are copied where
// they appear again, in the RateLimit member. When buf has room for the
// headers and r and t are below 2^32 (the common case), the digits are
// written straight into both of their places, two at a time; otherwise
// appendOneGrow formats and copies them.
func appendOne(buf []byte, ops []uint32, q *Quota) ([]byte, []uint32) {
	w := &q.Plan.wire
	rv, tv := Stated(q), q.Reset
	if uint64(rv) >= 1<<32 || uint64(tv) >= 1<<32 { // also negative
		return appendOneGrow(buf, ops, q)
	}
	r, t := countDigits(uint32(rv)), countDigits(uint32(tv))
	if cap(buf)-len(buf) < len(w.head)+len(nameReset)+len(w.member)+len(";t=")+len(w.policy)+2*(r+t) {
		return appendOneGrow(buf, ops, q) // the appends below must not move buf
	}
	buf = append(buf, w.head...)
	r0 := len(buf)
	buf = append(buf[:r0+r], nameReset...)
	t0 := len(buf)
	buf = append(buf[:t0+t], w.member...)
	r1 := len(buf)
	buf = append(buf[:r1+r], ";t="...)
	t1 := len(buf)
	buf = append(buf[:t1+t], w.policy...)
	// The digits of r, ending at r0+r and r1+r, then those of t, ending
	// at t0+t and t1+t, two at a time from the last (inline: a call per
	// count costs more than its digits).
	u, a, b := uint32(rv), r0+r, r1+r
	for k := 0; ; k++ {
		for u >= 100 {
			q := u / 100
			j := (u - q*100) * 2
			a, b = a-2, b-2
			buf[a], buf[a+1], buf[b], buf[b+1] = pairs[j], pairs[j+1], pairs[j], pairs[j+1]
			u = q
		}
		if u >= 10 {
			j := u * 2
			buf[a-2], buf[a-1], buf[b-2], buf[b-1] = pairs[j], pairs[j+1], pairs[j], pairs[j+1]
		} else {
			buf[a-1], buf[b-1] = byte('0'+u), byte('0'+u)
		}
		if k == 1 {
			break
		}
		u, a, b = uint32(tv), t0+t, t1+t
	}
	return buf, appendOneOps(ops, w, uint32(r), uint32(t))
}

// appendOneGrow is appendOne formatting r and t with AppendCount, for a
// buf without room (it grows) or counts from 2^32 on.
func appendOneGrow(buf []byte, ops []uint32, q *Quota) ([]byte, []uint32) {
	w := &q.Plan.wire
	buf = append(buf, w.head...)
	r0 := len(buf)
	buf = AppendCount(buf, Stated(q))
	r1 := len(buf)
	buf = append(buf, nameReset...)
	t0 := len(buf)
	buf = AppendCount(buf, q.Reset)
	t1 := len(buf)
	buf = append(buf, w.member...)
	buf = append(buf, buf[r0:r1]...)
	buf = append(buf, ";t="...)
	buf = append(buf, buf[t0:t1]...)
	buf = append(buf, w.policy...)
	return buf, appendOneOps(ops, w, uint32(r1-r0), uint32(t1-t0))
}

// appendOneOps appends appendOne's ops to ops, for r and t of r and t
// bytes.
func appendOneOps(ops []uint32, w *wire, r, t uint32) []uint32 {
	return append(ops,
		0, uint32(len(nameLimit)), uint32(len(w.head)-len(nameLimit)-len(nameRemaining)),
		0, uint32(len(nameRemaining)), r,
		0, uint32(len(nameReset)), t,
		1, uint32(len(nameList)), uint32(len(w.member)-len(nameList))+r+3+t,
		1, uint32(len(namePolicy)), uint32(len(w.policy)-len(namePolicy)))
}

// pow10 holds the powers of ten a uint32 reaches.
var pow10 = [10]uint32{1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000}

// countDigits returns the number of decimal digits of u (1 for 0): the
// bit length times log10(2) (1233/4096), corrected by one comparison.
func countDigits(u uint32) int {
	u |= 1                            // 0 has one digit, as 1 has
	n := (bits.Len32(u) * 1233) >> 12 // floor(log10(u)) or one more
	if u < pow10[n] {
		return n
	}
	return n + 1
}

// pairs holds the two digits of each number below 100.
const pairs = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"
