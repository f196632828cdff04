package filter

import (
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// Settling after the response
//
// A rule with count_statuses, reset_on_statuses or a response_* cost takes
// its admission cost as any rule does (the cost, or for a response_* cost
// the reservation: pre_charge or the request's estimate, cost.go), and the
// stream remembers the bucket it took from (a charge), shadow rules
// included: they settle as they would if enforced. When the response
// says more, the charge is settled exactly once, by whichever of these
// comes first:
//
//   - proxy_on_response_headers: a status that count_statuses does not
//     list refunds the admission cost; one reset_on_statuses lists fills
//     the bucket; a response_header cost is read; a compressed body
//     (content-encoding other than identity) cannot be read, so the cost
//     is unreported (below); a response without a body ends here.
//   - proxy_on_response_body with end_of_stream, or
//     proxy_on_response_trailers: the body has been read, chunk by chunk,
//     through a JSON pointer scanner of bounded memory; the cost is the
//     number found, or unreported.
//   - proxy_on_done or proxy_on_delete (the stream was reset, the client
//     left, or the host never delivered the end of the body): a response_*
//     cost is the last number found so far, or unreported when none was
//     (also when no response arrived at all: nothing was reported); a
//     count_statuses or reset_on_statuses rule whose request never got a
//     response keeps its admission cost (there is no status to judge).
//
// An unreported cost is what admission reserved, or default_cost if more
// (charge.unreported). The difference between the cost and what admission
// took is refunded or charged (sharedstate.Updater.Settle); a charge takes
// the bucket into debt, carried in full (nothing forgives it). The
// response itself is never paused or buffered: every callback returns
// Continue.
//
// Requests in flight (concurrency.go) are released on the same paths, and
// the settlements of cluster-scope rules are sent to the rate-limit service
// from there (cluster_settle.go).

// bodyWindow is the most body bytes read at once.
const bodyWindow = 8 << 10

// settleState is what a stream settles when it ends.
type settleState struct {
	charges []charge
	// awaiting are the cluster charges of a request the rate-limit
	// service has not admitted yet, and remote the settlements queued for
	// it (cluster_settle.go).
	awaiting []charge
	remote   []rlscontract.Descriptor
	// receipt is the stream's receipt id, sent with its calls to the
	// service once a cluster rule settles (trackCluster).
	receipt string
	slots   []slot
	// estimating: a charge awaits its estimate from the request body,
	// bodySize bytes of which the host has buffered (estimate.go).
	estimating bool
	bodySize   int
	// encoded: the request body has a Content-Encoding the estimate
	// scanner cannot read (requestEncoded): the estimate is the ceiling.
	encoded bool
	// status is the response's :status, 0 before proxy_on_response_headers.
	status int
	ended  bool
}

// charge is one bucket a stream took from, to settle when the response
// says more.
type charge struct {
	r   *rule
	req sharedstate.Request // keys copied; Stored is the bucket
	pre float64             // what admission took
	// done: settled already.
	done bool
	// estimate: the charge awaits its estimate from the request body
	// (estimate.go); its scans read the body until then. ask: the rest of
	// it a cluster charge asks of the service (cluster_estimate.go).
	estimate bool
	ask      float64
	// body: the cost is read from the body; scanning: still reading it.
	body, scanning bool
	scans          []ljson.PointerScanner
	// last and have hold, per pointer, the last number found (SSE: in an
	// event that carried it).
	last []float64
	have []bool
	sse  sseReader
	// cluster is set for a cluster-scope rule, settled in the rate-limit
	// service (cluster_settle.go) rather than in shared data.
	cluster *clusterCharge
}

// settleOf returns the stream's settle state, creating it.
func (s *Stream) settleOf() *settleState {
	if s.st.settle == nil {
		s.st.settle = &settleState{}
	}
	return s.st.settle
}

// track remembers, for an admitted request, the buckets of g whose rules
// settle after the response.
func (s *Stream) track(g *group) {
	for i, r := range g.rules {
		if r.Settle == nil {
			continue
		}
		req := g.reqs[i]
		req.Key, req.Alt, req.Owner, req.Stored = strings.Clone(req.Key), strings.Clone(req.Alt), strings.Clone(req.Owner), strings.Clone(req.Stored)
		st := s.settleOf()
		pre := req.Cost
		if pre == admitPositive {
			pre = 0 // pre_charge 0: admission took nothing a balance shows
		}
		st.charges = append(st.charges, charge{r: r, req: req, pre: pre})
		s.awaitBody(&st.charges[len(st.charges)-1])
		s.identity(r)
	}
}

// awaitBody marks c as awaiting its estimate from the request body when
// its rule takes it there and a body follows.
func (s *Stream) awaitBody(c *charge) {
	st := s.st.settle
	c.estimate = s.st.hasBody && awaitsEstimate(c.r)
	st.estimating = st.estimating || c.estimate
	st.encoded = st.encoded || c.estimate && requestEncoded(s.p.host)
}

// identity asks the upstream for an uncompressed body when r reads its cost
// there and says so (strip_accept_encoding): Accept-Encoding becomes
// "identity", since a compressed body cannot be read and costs only what
// was reserved. An Envoy compressor placed before tokengate still
// compresses the answer to the client (docs/configuration.md).
func (s *Stream) identity(r *rule) {
	if r.Settle.StripAcceptEncoding && s.p.rhs != nil {
		s.p.rhs.SetRequestHeader("accept-encoding", "identity")
	}
}

// trackShadow tracks the shadow buckets that took their cost, so that they
// settle as they would if enforced: a shadow rule predicts what enforcing
// it would do, and a count_statuses rule that never refunded successes
// would predict 429s for every key past burst requests, successful or
// not. Shadow settlements are counted like enforced ones (settle_*).
func (s *Stream) trackShadow(g *group) {
	for _, r := range g.rules {
		if r.Settle != nil {
			s.track(g)
			return
		}
	}
}

// dropCharges forgets the charges of a request the upstream will never
// answer: its admission was undone (a cluster rule rejected it and the
// local buckets were refunded), or the filter answered it itself (a local
// reply: a rejection, a 503). Enforced buckets took nothing by then; shadow
// buckets keep their admission cost, as a shadow rule without settlement
// does whatever the enforced rules decide.
func (s *Stream) dropCharges() {
	if s.st.settle != nil {
		s.st.settle.charges = s.st.settle.charges[:0]
		s.st.settle.awaiting = s.st.settle.awaiting[:0]
	}
}

// settleHeaders is the settlement work of proxy_on_response_headers.
func (s *Stream) settleHeaders(endOfStream bool) {
	st := s.st.settle
	if st == nil || st.ended || len(st.charges) == 0 {
		return
	}
	p := s.p
	v, _ := p.host.ResponseHeader(":status")
	st.status, _ = strconv.Atoi(v)
	enc, _ := p.host.ResponseHeader("content-encoding")
	encoded := enc != "" && !lite.EqualFoldASCII(enc, "identity")
	canRead := p.br != nil
	for i := range st.charges {
		c := &st.charges[i]
		spec := c.r.Settle
		switch {
		case spec.HasReset && spec.Reset.Has(st.status):
			s.apply(c, sharedstate.SettleReset, 0)
		case spec.HasCount && !spec.Count.Has(st.status):
			s.apply(c, sharedstate.SettleRefund, c.pre)
		case spec.Response == config.ResponseNone:
			c.done = true // the admission cost stands
		case spec.Response == config.ResponseHeader:
			actual := c.unreported()
			if hv, ok := p.host.ResponseHeader(spec.Header); ok {
				if n, ok := parseReported(hv); ok {
					actual = n
				}
			}
			s.settleCost(c, actual)
		case encoded || !canRead:
			s.settleCost(c, c.unreported())
		default:
			c.body, c.scanning = true, true
			n := len(spec.Pointers)
			c.scans = make([]ljson.PointerScanner, n)
			c.last, c.have = make([]float64, n), make([]bool, n)
			for k := range c.scans {
				c.scans[k].Reset(spec.Pointers[k])
			}
		}
	}
	if endOfStream {
		s.finish()
	}
}

// parseReported parses a cost a response reports: ParseCost, or zero.
func parseReported(v string) (float64, bool) {
	if n, ok := ParseCost(v); ok {
		return n, true
	}
	t := strings.Trim(v, " \t")
	if t != "" && strings.Trim(t, "0.") == "" && t[0] == '0' && !strings.HasSuffix(t, ".") && strings.Count(t, ".") <= 1 {
		return 0, true
	}
	return 0, false
}

// OnResponseBody is proxy_on_response_body: the chunk is read, a window at
// a time, into the scanners of the charges that look for their cost in
// the body. The response always continues.
func (s *Stream) OnResponseBody(size int, endOfStream bool) (act Action) {
	defer s.p.recoverTo("proxy_on_response_body", func() { act = Continue })
	st := s.st.settle
	if st == nil || st.ended {
		return Continue
	}
	if br := s.p.br; br != nil && size > 0 && st.scanning() {
		for start := 0; start < size && st.scanning(); {
			b, ok := br.ResponseBody(start, min(bodyWindow, size-start))
			if !ok || len(b) == 0 {
				break
			}
			start += len(b)
			for i := range st.charges {
				if c := &st.charges[i]; c.scanning {
					c.feed(b)
				}
			}
		}
	}
	if endOfStream {
		s.finish()
	}
	return Continue
}

// scanning reports whether some charge still reads the body.
func (st *settleState) scanning() bool {
	for i := range st.charges {
		if st.charges[i].scanning && !st.charges[i].done {
			return true
		}
	}
	return false
}

// OnResponseTrailers is proxy_on_response_trailers: the body has ended.
func (s *Stream) OnResponseTrailers(numTrailers int) (act Action) {
	defer s.p.recoverTo("proxy_on_response_trailers", func() { act = Continue })
	s.finish()
	return Continue
}

// OnDone is proxy_on_done: the stream has ended, by whatever path.
func (s *Stream) OnDone() {
	defer s.p.recoverTo("proxy_on_done", nil)
	s.end()
}

// finish settles every charge not yet settled and releases the stream's
// places in flight, once.
func (s *Stream) finish() {
	st := s.st.settle
	if st == nil || st.ended {
		return
	}
	st.ended = true
	for i := range st.charges {
		c := &st.charges[i]
		if c.done {
			continue
		}
		switch {
		case st.status == 0 && c.r.Settle.Response == config.ResponseNone:
			c.done = true // no response: the admission cost stands
		case c.body:
			s.settleCost(c, c.result())
		default:
			s.settleCost(c, c.unreported())
		}
	}
	s.releaseAll()
	s.sendClusterSettles()
}

// result is the cost a scanned body reported: the sum of the numbers found
// at the pointers, or default_cost if none was.
func (c *charge) result() float64 {
	if c.r.Settle.Response == config.ResponseSSE {
		c.sse.finish(c)
	} else if c.scanning {
		for k := range c.scans {
			c.scans[k].End()
			c.last[k], c.have[k] = c.scans[k].Found()
		}
	}
	sum, any := 0.0, false
	for k := range c.last {
		if c.have[k] {
			sum, any = sum+c.last[k], true
		}
	}
	if !any {
		return c.unreported()
	}
	return sum
}

// unreported is the cost of a request whose usage was never seen (the
// response named none, its body was compressed, the client left or the
// upstream reset the stream first): default_cost, but never less than
// what the request reserved at admission, so that leaving early or asking
// for a compressed body never makes a request cheaper.
func (c *charge) unreported() float64 { return max(c.pre, c.r.Cost.Default) }

// feed reads a piece of the body into c's scanners.
func (c *charge) feed(b []byte) {
	if c.r.Settle.Response == config.ResponseSSE {
		c.sse.feed(c, b)
		return
	}
	done := true
	for k := range c.scans {
		c.scans[k].Write(b)
		done = done && c.scans[k].Done()
	}
	if done {
		// Every document has ended (or is not JSON): nothing more to read.
		c.scanning = false
		c.last = c.last[:len(c.scans)]
		for k := range c.scans {
			c.last[k], c.have[k] = c.scans[k].Found()
		}
		c.scans = c.scans[:0]
	}
}

// settleCost settles c for a request that cost actual tokens.
func (s *Stream) settleCost(c *charge, actual float64) {
	switch d := actual - c.pre; {
	case d > 0:
		s.apply(c, sharedstate.SettleCharge, d)
	case d < 0:
		s.apply(c, sharedstate.SettleRefund, -d)
	default:
		c.done = true
	}
}

// apply settles c once.
func (s *Stream) apply(c *charge, op sharedstate.SettleOp, amount float64) {
	if c.done {
		return
	}
	c.done, c.scanning = true, false
	if c.cluster != nil {
		s.queueClusterSettle(c, op, amount)
		return
	}
	p := s.p
	now := p.time()
	n, err := p.upd.Settle(&c.req, op, amount, now)
	c.r.metrics.casRetries.inc(p.host, int64(n))
	switch op {
	case sharedstate.SettleCharge:
		c.r.metrics.settleCharged.inc(p.host, 1)
	case sharedstate.SettleRefund:
		c.r.metrics.settleRefunded.inc(p.host, 1)
	case sharedstate.SettleReset:
		c.r.metrics.settleReset.inc(p.host, 1)
	}
	if err != nil {
		p.warnf(now, "event=settle_error rule="+c.r.Name+" key=#"+reqHash(&c.req)+" reason="+strconv.Quote(err.Error()))
	}
}

// sseReader follows server-sent events (the text/event-stream format)
// through the body's chunks: the data lines of each event are fed to the
// charge's scanners, and when the event ends (a blank line) each pointer
// found in it replaces the last number seen for that pointer. It keeps
// nothing but its state and the five bytes of a field name.
type sseReader struct {
	_     incomparable
	state uint8
	field [4]byte
	n     int
	data  bool // the event has data lines
}

const (
	sseLineStart = iota
	sseField
	sseDataStart
	sseData
	sseSkip
	sseCR
)

func (r *sseReader) feed(c *charge, b []byte) {
	for i := 0; i < len(b); {
		switch r.state {
		case sseLineStart:
			switch b[i] {
			case '\r', '\n':
				if b[i] == '\r' {
					r.state = sseCR
				}
				i++
				r.dispatch(c)
				continue
			}
			r.state, r.n = sseField, 0
		case sseField:
			ch := b[i]
			i++
			switch ch {
			case ':':
				r.state = sseSkip
				if r.isData() {
					r.state = sseDataStart
				}
			case '\r', '\n':
				if r.isData() { // "data" alone: an empty data line
					r.line(c, nil)
				}
				r.state = sseLineStart
				if ch == '\r' {
					r.state = sseCR
				}
			default:
				if r.n < len(r.field) {
					r.field[r.n] = ch
				}
				r.n++
			}
		case sseDataStart:
			if b[i] == ' ' {
				i++
			}
			r.state = sseData
		case sseData:
			j := i
			for j < len(b) && b[j] != '\n' && b[j] != '\r' {
				j++
			}
			r.line(c, b[i:j])
			if j == len(b) {
				return
			}
			r.end(c, b[j])
			i = j + 1
		case sseSkip:
			for i < len(b) && b[i] != '\n' && b[i] != '\r' {
				i++
			}
			if i < len(b) {
				r.state = sseLineStart
				if b[i] == '\r' {
					r.state = sseCR
				}
				i++
			}
		case sseCR:
			if b[i] == '\n' {
				i++
			}
			r.state = sseLineStart
		}
	}
}

// newline joins the data lines of an event.
var newline = []byte{'\n'}

func (r *sseReader) isData() bool { return r.n == 4 && string(r.field[:]) == "data" }

// line feeds part of a data line to the scanners.
func (r *sseReader) line(c *charge, b []byte) {
	r.data = true
	for k := range c.scans {
		c.scans[k].Write(b)
	}
}

// end ends a data line (lines of one event are joined by '\n').
func (r *sseReader) end(c *charge, eol byte) {
	for k := range c.scans {
		c.scans[k].Write(newline)
	}
	r.state = sseLineStart
	if eol == '\r' {
		r.state = sseCR
	}
}

// dispatch ends an event.
func (r *sseReader) dispatch(c *charge) {
	if !r.data {
		return
	}
	r.data = false
	for k := range c.scans {
		c.scans[k].End()
		if v, ok := c.scans[k].Found(); ok {
			c.last[k], c.have[k] = v, true
		}
		c.scans[k].Reset(c.r.Settle.Pointers[k])
	}
}

// finish is the end of the body: an event left without its blank line
// still counts, since its tokens were spent.
func (r *sseReader) finish(c *charge) {
	r.dispatch(c)
}
