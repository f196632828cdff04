package filter

// The plugin's one table of callouts in flight (Plugin.callouts, one per
// worker VM).
//
// Who owns what:
//   - the code that makes a call (proxy_http_call) adds its token to the
//     table with the owner of the answer, and nothing else keeps the token
//     but the stream that waits for it (reqState.cont.call, to drop the entry when
//     the stream ends first): a request's rate-limit call (cluster.go, the
//     *pendingCall's answered), a lease call (lease_call.go, the *leaseCall's
//     answered) and a settlement (cluster_settle.go, settleAnswered);
//   - OnHTTPCallResponse takes the entry out of the table and hands the
//     answer to its owner, which alone reads it (readRLS) and acts on it.
//     A token not in the table (its stream ended first, or the call is not
//     ours) is dropped.
//
// A slice, not a map: few calls are in flight at once, and a map type costs
// the module tens of kilobytes.

// callout is one call in flight.
type callout struct {
	token uint32
	owner calloutOwner
}

// calloutOwner handles the answer to one call; numHeaders is 0 when the
// call failed (timeout, connection failure). The call is out of the table
// by then. A func (the owner's answered method), not an interface: an
// owner type held in an interface keeps the methods of every type it
// reaches (Rule, Descriptor...) in the module, about 7 KB.
type calloutOwner func(p *Plugin, numHeaders, bodySize int)

// calloutTable is the calls a plugin has in flight.
type calloutTable struct {
	c []callout
}

// add records a call in flight and the owner of its answer.
func (t *calloutTable) add(token uint32, owner calloutOwner) {
	t.c = append(t.c, callout{token: token, owner: owner})
}

// take removes the call with this token and returns its owner, or nil if
// the table has none.
func (t *calloutTable) take(token uint32) calloutOwner {
	for i := range t.c {
		if t.c[i].token == token {
			o := t.c[i].owner
			last := len(t.c) - 1
			t.c[i] = t.c[last]
			t.c[last] = callout{}
			t.c = t.c[:last]
			return o
		}
	}
	return nil
}

// OnHTTPCallResponse is proxy_on_http_call_response: the answer to a call
// (no headers: its failure), handed to the call's owner.
func (p *Plugin) OnHTTPCallResponse(token uint32, numHeaders, bodySize, numTrailers int) {
	defer p.recoverTo("proxy_on_http_call_response", nil)
	if o := p.callouts.take(token); o != nil {
		o(p, numHeaders, bodySize)
	}
}

// answered is a lease call's answer (lease_call.go).
func (lc *leaseCall) answered(p *Plugin, numHeaders, bodySize int) {
	p.leaseAnswer(lc, numHeaders, bodySize)
}
