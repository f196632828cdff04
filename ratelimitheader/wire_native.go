//go:build !wasip1

package ratelimitheader

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
// they appear again, in the RateLimit member.
func appendOne(buf []byte, ops []uint32, q *Quota) ([]byte, []uint32) {
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
	r, t := uint32(r1-r0), uint32(t1-t0)
	ops = append(ops,
		0, uint32(len(nameLimit)), uint32(len(w.head)-len(nameLimit)-len(nameRemaining)),
		0, uint32(len(nameRemaining)), r,
		0, uint32(len(nameReset)), t,
		1, uint32(len(nameList)), uint32(len(w.member)-len(nameList))+r+3+t,
		1, uint32(len(namePolicy)), uint32(len(w.policy)-len(namePolicy)))
	return buf, ops
}
