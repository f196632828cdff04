package rlscontract

import (
	"errors"
	"strconv"
)

// LeaseAnswer is tokengate-rls's answer to a lease call (docs/lease.md,
// "Wire protocol"): the one DescriptorStatus of its RateLimitResponse.
// LeaseStatus builds it (the service) and ParseLeaseAnswer reads it (the
// filter).
type LeaseAnswer struct {
	// OverLimit reports that tokens were wanted and none were free: the
	// status's code is OVER_LIMIT, else OK.
	OverLimit bool
	// Retry is duration_until_reset, in seconds: with OverLimit, the wait
	// until a token is free.
	Retry float64
	// Remaining is limit_remaining: the free tokens this holder could
	// still be granted (an exact take: the bucket's tokens left).
	Remaining uint32
	// HasGrant reports whether the answer carries a grant (the status's
	// quota): every answer to a holder's request does, a release and an
	// exact take do not.
	HasGrant bool
	// Grant is the grant's id (quota.id, in decimal, never 0).
	Grant uint64
	// Tokens is the grant's whole amount (quota.requests): the reported
	// unspent tokens the service carried over plus the new ones.
	Tokens uint32
	// ValidUntil is the grant's expiry (quota.valid_until), in seconds
	// since the Unix epoch.
	ValidUntil float64
}

// LeaseStatus returns a's DescriptorStatus (current_limit is the rule's,
// which the service adds).
func LeaseStatus(a LeaseAnswer) Status {
	s := Status{Code: CodeOK, LimitRemaining: a.Remaining, UntilReset: a.Retry}
	if a.OverLimit {
		s.Code = CodeOverLimit
	}
	if a.HasGrant {
		s.HasQuota = true
		s.Quota = Quota{Requests: a.Tokens, ID: strconv.FormatUint(a.Grant, 10), ValidUntil: a.ValidUntil}
	}
	return s
}

// ParseLeaseAnswer reads the answer to a lease call from its response,
// which must hold one status. The answer to a holder's request (grant:
// neither a release nor an exact take) must carry a quota; a quota's id,
// read unless the call was an exact take, must be a decimal number other
// than 0. The errors say what was wrong, for the filter's log.
func ParseLeaseAnswer(r *Response, grant, exact bool) (LeaseAnswer, error) {
	if len(r.Statuses) != 1 {
		return LeaseAnswer{}, errors.New("lease answer with " + strconv.Itoa(len(r.Statuses)) + " statuses")
	}
	st := &r.Statuses[0]
	if grant && !st.HasQuota {
		return LeaseAnswer{}, errors.New("lease answer without a quota")
	}
	a := LeaseAnswer{OverLimit: st.Code == CodeOverLimit, Retry: st.UntilReset, Remaining: st.LimitRemaining}
	if st.HasQuota && !exact {
		id, err := strconv.ParseUint(st.Quota.ID, 10, 64)
		if err != nil || id == 0 {
			return LeaseAnswer{}, errors.New("lease grant id " + strconv.Quote(st.Quota.ID))
		}
		a.HasGrant, a.Grant, a.Tokens, a.ValidUntil = true, id, st.Quota.Requests, st.Quota.ValidUntil
	}
	return a, nil
}
