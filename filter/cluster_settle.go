package filter

import (
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// Settling cluster-scope rules (docs/rls.md, "Settling after the response")
//
// A cluster rule with count_statuses, reset_on_statuses or a response_*
// cost took its admission cost in the rate-limit service: hits_addend, the
// cost rounded up, and 1 for a cost of 0 (RLS reads 0 as "unset", which
// is 1). Once the service has admitted the request, each such rule becomes
// a charge of the stream like a local one, but what settle.go decides for
// it is queued instead of applied to shared data, and when the stream ends
// (finish) the queue goes to the service in one more ShouldRateLimit:
//
//   - an extra charge: the descriptor [tokengate_rule, key] again, with
//     hits_addend the extra tokens rounded up: what Envoy's own
//     apply_on_stream_done sends, so envoyproxy/ratelimit counts it too;
//     the call carries the header "tokengate-settle: 1", which tells
//     tokengate-rls to take them whatever the bucket holds, in full,
//     instead of deciding;
//   - a refund: [tokengate_rule, key, (tokengate_settle, refund),
//     (tokengate_amount, N)] (hits_addend is unsigned); a service that does
//     not know these entries (envoyproxy/ratelimit) matches no limit and
//     changes nothing: the tokens stay taken;
//   - a reset: [tokengate_rule, key, (tokengate_settle, reset)].
//
// The call is proxy_http_call made from the stream's last callback; Envoy
// makes every call on the root context, so it outlives the stream and its
// answer comes to OnHTTPCallResponse, where only a failure matters: it is
// counted (tokengate.rls_settle_errors) and logged. The response itself was
// never paused. At most maxSettleCalls are in flight per worker; a
// settlement beyond that is dropped and counted the same way.
//
// When on_error: local decided the cluster rules in shared data, they
// settle there like local rules; when the service failed and the request
// went through (on_error: allow), nothing was taken and nothing settles.

// Bounds of the settlement calls; their descriptors are
// rlscontract.SettlementDescriptor, the call marked with
// rlscontract.SettleHeader (docs/rls.md).
const (
	// maxSettleCalls bounds the settlement calls in flight per worker.
	maxSettleCalls = 1024
	// minSettleTimeoutMs is the least a settlement call may take: nobody
	// waits for it, and one that times out may be lost.
	minSettleTimeoutMs = 1000
)

// clusterCharge is the service side of a charge: the composite key sent.
type clusterCharge struct {
	comp string
}

// trackCluster remembers, while the request waits for the service, the
// cluster rules of g that settle and what the service takes for each (the
// hits of ds); admitCluster makes them charges once it has admitted the
// request. When one settles, it returns the stream's receipt id
// (rlscontract.ReceiptHeader), drawn at its first such call and sent
// again with its settlement ("" otherwise). The service keeps what the
// admission took under it, and gives the settlement back no more than
// that (docs/rls.md#receipts); 63 random bits, so that no other
// caller can name it to take this stream's tokens back.
func (s *Stream) trackCluster(g *group, ds []rlscontract.Descriptor) string {
	var st *settleState
	for i, r := range g.rules {
		if r.Settle == nil || r.Lease != nil || i >= len(ds) || len(ds[i].Entries) < 2 {
			continue
		}
		st = s.settleOf()
		st.awaiting = append(st.awaiting, charge{r: r, pre: float64(max(ds[i].HitsAddend, 1)),
			cluster: &clusterCharge{comp: ds[i].Entries[1].Value}})
		s.awaitBody(&st.awaiting[len(st.awaiting)-1])
		s.identity(r)
	}
	if st == nil {
		return ""
	}
	if st.receipt == "" {
		st.receipt = strconv.FormatUint(rand.Uint64()|1<<60, 16)
	}
	return st.receipt
}

// admitCluster turns the awaited cluster charges into the stream's charges:
// the service admitted the request. A shadow rule's bucket took its hits
// only if no shadow rule was over its limit (tokengate-rls refunds a shadow
// group that fails as a whole, as it does the enforced one).
func (s *Stream) admitCluster(pc *pendingCall, resp *rlscontract.Response) {
	st := s.st.settle
	if st == nil {
		return
	}
	for i := range st.charges { // a body's estimate taken (cluster_estimate.go)
		c := &st.charges[i]
		c.pre, c.ask = c.pre+c.ask, 0
	}
	if len(st.awaiting) == 0 {
		return
	}
	shadowTook := len(resp.Statuses) == len(pc.rules)
	if shadowTook {
		for i, stt := range resp.Statuses {
			if pc.rules[i].Shadow && stt.Code == rlscontract.CodeOverLimit {
				shadowTook = false
			}
		}
	}
	for _, c := range st.awaiting {
		if !c.r.Shadow || shadowTook {
			st.charges = append(st.charges, c)
		}
	}
	st.awaiting = st.awaiting[:0]
}

// dropAwaiting forgets the awaited cluster charges: the service did not
// admit the request (it failed, or rejected it).
func (s *Stream) dropAwaiting() {
	if s.st.settle != nil {
		s.st.settle.awaiting = s.st.settle.awaiting[:0]
	}
}

// settleClusterLocally makes the cluster rules that on_error: local decided
// in shared data (reqs, stored by TakeAll) settle there, as local rules do.
func (s *Stream) settleClusterLocally(rules []*rule, reqs []sharedstate.Request) {
	for i, r := range rules {
		if r.Settle == nil || i >= len(reqs) {
			continue
		}
		req := reqs[i]
		pre := req.Cost
		if pre == admitPositive {
			pre = 0
		}
		st := s.settleOf()
		st.charges = append(st.charges, charge{r: r, req: req, pre: pre})
		s.awaitBody(&st.charges[len(st.charges)-1])
	}
}

// queueClusterSettle queues the settlement settle.go decided for a cluster
// charge; sendClusterSettles sends the queue when the stream ends.
func (s *Stream) queueClusterSettle(c *charge, op sharedstate.SettleOp, amount float64) {
	p := s.p
	set := rlscontract.Settlement{Rule: c.r.Name, Composite: c.cluster.comp}
	switch op {
	case sharedstate.SettleCharge:
		set.Kind, set.Hits = rlscontract.SettleCharge, uint64(math.Ceil(amount))
		if set.Hits == 0 {
			return
		}
		c.r.metrics.settleCharged.inc(p.host, 1)
	case sharedstate.SettleRefund:
		set.Kind, set.Amount = rlscontract.SettleRefund, sharedstateFloor(amount) // never give back more than was taken
		if !(set.Amount > 0) {
			return
		}
		c.r.metrics.settleRefunded.inc(p.host, 1)
	case sharedstate.SettleReset:
		set.Kind = rlscontract.SettleReset
		c.r.metrics.settleReset.inc(p.host, 1)
	}
	s.st.settle.remote = append(s.st.settle.remote, rlscontract.SettlementDescriptor(set))
}

// sendClusterSettles sends the stream's queued cluster settlements in one
// call, once; the stream does not wait for the answer.
func (s *Stream) sendClusterSettles() {
	st := s.st.settle
	if st == nil || len(st.remote) == 0 {
		return
	}
	ds := st.remote
	st.remote = nil
	p := s.p
	now := p.time()
	fail := func(reason string) {
		p.metrics.settleErrors.inc(p.host, 1)
		p.warnf(now, "event=rls_settle_error settlements="+strconv.Itoa(len(ds))+" reason="+strconv.Quote(reason))
	}
	if p.cfg == nil || p.cfg.Settings.RLS == nil {
		fail("no rate-limit service configured")
		return
	}
	if p.caller == nil {
		fail("the host has no HTTP callouts")
		return
	}
	if p.settling >= maxSettleCalls {
		fail("too many settlement calls in flight (" + strconv.Itoa(maxSettleCalls) + ")")
		return
	}
	rls := p.cfg.Settings.RLS
	token, err := callRLSWith(p.caller, rls, ds, max(rls.TimeoutMs, minSettleTimeoutMs), [][2]string{{rlscontract.SettleHeader, "1"}}, st.receipt)
	if err != nil {
		fail("dispatch: " + err.Error())
		return
	}
	p.callouts.add(token, settleAnswered)
	p.settling++
	p.metrics.settleCalls.inc(p.host, 1)
}

// settleAnswered is the owner of a settlement's answer (callouts.go): it
// counts a failure; the answer itself changes nothing.
func settleAnswered(p *Plugin, numHeaders, bodySize int) {
	p.settling--
	if _, reason := p.readRLS(numHeaders, bodySize); reason != "" {
		p.metrics.settleErrors.inc(p.host, 1)
		p.warnf(p.time(), "event=rls_settle_error reason="+strconv.Quote(reason))
	}
}
