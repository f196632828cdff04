package filter

import "github.com/tokengate/tokengate/rlscontract"

// Estimates from the request body for cluster rules
//
// A cluster rule (a token bucket or a quota) whose estimate is in the
// request body ("estimate_source": "request_json:...") is admitted in two
// steps, as a local one is (estimate.go): at the headers the service takes
// pre_charge (hits_addend, at least 1) in the request's one call with the
// other cluster rules; when the body has been read, the rest of the
// estimate, min(estimate, burst) - pre_charge rounded up, is asked of the
// service in a second call (askEstimate) that holds the body (and so the
// upstream) until it answers. The rules asked are decided all or nothing
// there, as in any call. If the service refuses, every settling rule gives
// back what it took at the headers (refundCharges: a settlement refund for
// a cluster rule) and the request gets the service's 429; if it fails,
// settings.rls.on_error decides: "deny" answers 503 and gives back the
// same, "allow" and "local" let the request go on with what the headers
// took (counted fail_open: the service's part of the estimate has no
// shared-data bucket to fall back to). After the response, the usage
// settles against everything taken (cluster_settle.go).
//
// The bound this gives a budget of B (a quota's limit, or a bucket's
// burst): the service admits a reservation only while the consumption it
// stores plus the reservation stays within B, and a settlement's extra
// charge is taken in full afterwards. So the consumption can pass B only
// through the requests already admitted (in flight) when the last one was
// admitted, each by what its usage exceeds its reservation:
//
//	consumed <= B + sum over those in flight of max(0, usage - min(estimate, B))
//
// With P requests in flight at most and an estimate that bounds the usage
// charged (max_tokens, when the usage read is the completion's tokens), the
// overspend is 0; otherwise at most P * (the largest usage - the smallest
// estimate). Rounding adds nothing: reservations round up, refunds down.

// estimateCall is what askEstimate asks: the descriptors of the cluster
// charges that need more than the headers took (charge.ask) and their
// rules, in the same order.
type estimateCall struct {
	req   request
	ds    []rlscontract.Descriptor
	rules []*rule
}

// askEstimate asks the rate-limit service for the rest of the estimates
// in a, in one call, and holds the body until it answers; Continue when a
// asks nothing. The answer is a cluster call's (pendingCall.answered),
// marked body: a refusal gives back what the settling rules took
// (refundLocal), an admission adds the asks to what they took
// (admitCluster).
func (s *Stream) askEstimate(a *estimateCall, now float64) Action {
	if len(a.ds) == 0 {
		return Continue
	}
	req := &a.req
	// The rest of the estimate goes on the receipt the headers' take
	// opened, so that the settlement may give it back.
	var receipt string
	if st := s.st.settle; st != nil {
		receipt = st.receipt
	}
	return s.sendCall(&pendingCall{s: s, now: now, body: true, idHash: req.identityHash(), grpc: isGRPCRequest(req), rules: a.rules}, a.ds, receipt)
}
