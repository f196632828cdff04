package filtertest

import (
	"errors"
	"strings"

	"github.com/tokengate/tokengate/filter"
)

// Call is one proxy_http_call the filter made.
type Call struct {
	Token     uint32
	Cluster   string
	Headers   [][2]string
	Body      []byte
	TimeoutMs uint32
	// Stream is the context id of the stream that was current when the
	// call was made.
	Stream uint32
}

// CallResponse is the response Deliver hands the filter; a nil Headers
// is a failed call (timeout, no connection), as Envoy reports it.
type CallResponse struct {
	Headers, Trailers [][2]string
	Body              []byte
}

// callouts is the Host's model of HTTP callouts and effective contexts.
type callouts struct {
	// CallError, if set, makes HTTPCall fail (the host refused the call).
	CallError error
	// Calls are the calls made, in order.
	Calls []Call
	// Gone holds stream ids that ended: SetEffectiveContext fails for them.
	Gone map[uint32]bool
	// Continued lists the streams ContinueRequest resumed, in order.
	Continued []uint32

	next, streamID, effective uint32
	resp                      *CallResponse
}

var _ filter.Caller = (*Host)(nil)

// HTTPCall implements filter.Caller: it records the call.
func (h *Host) HTTPCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, error) {
	if h.CallError != nil {
		return 0, h.CallError
	}
	h.next++
	hs := make([][2]string, len(headers))
	for i, kv := range headers {
		hs[i] = [2]string{strings.Clone(kv[0]), strings.Clone(kv[1])}
	}
	h.Calls = append(h.Calls, Call{Token: h.next, Cluster: strings.Clone(cluster), Headers: hs,
		Body: append([]byte(nil), body...), TimeoutMs: timeoutMs, Stream: h.effective})
	return h.next, nil
}

func find(hs [][2]string, name string) (string, bool) {
	for _, kv := range hs {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// CallResponseHeader implements filter.Caller.
func (h *Host) CallResponseHeader(name string) (string, bool) {
	if h.resp == nil {
		return "", false
	}
	v, ok := find(h.resp.Headers, name)
	return view(h.hand(v)), ok
}

// CallResponseTrailer implements filter.Caller.
func (h *Host) CallResponseTrailer(name string) (string, bool) {
	if h.resp == nil {
		return "", false
	}
	v, ok := find(h.resp.Trailers, name)
	return view(h.hand(v)), ok
}

// CallResponseBody implements filter.Caller.
func (h *Host) CallResponseBody(size int) ([]byte, bool) {
	if h.resp == nil || size > len(h.resp.Body) {
		return nil, false
	}
	return h.hand(string(h.resp.Body[:size])), true
}

// SetEffectiveContext implements filter.Caller.
func (h *Host) SetEffectiveContext(id uint32) bool {
	if h.Gone[id] {
		return false
	}
	h.effective = id
	return true
}

// ContinueRequest implements filter.Caller.
func (h *Host) ContinueRequest() error {
	if h.effective == 0 {
		return errors.New("filtertest: continue without an effective stream")
	}
	h.Continued = append(h.Continued, h.effective)
	return nil
}

// Start runs a request's headers through a new stream with its own context
// id, and returns the stream, so that a test can deliver the answers of
// calls it made (Deliver) and end it (Release) in the order it chooses.
func (h *Host) Start(p *filter.Plugin, req Request) (*filter.Stream, Result) {
	h.Request, h.Response = req, Response{}
	h.streamID++
	s := p.NewStream()
	s.SetID(h.streamID)
	h.effective = h.streamID
	res := Result{RequestAction: s.OnRequestHeaders(len(req.Headers), true)}
	h.EndCallback()
	h.effective = 0
	res.Response = h.Response
	return s, res
}

// Deliver hands the filter the response of call token, in the root
// context, as proxy_on_http_call_response, and returns what the filter did
// with its stream: a local reply in Response.Local, or a resumption
// recorded in Continued.
func (h *Host) Deliver(p *filter.Plugin, token uint32, resp CallResponse) Response {
	h.Response = Response{}
	h.resp = &resp
	body := 0
	if resp.Headers != nil {
		body = len(resp.Body)
	}
	p.OnHTTPCallResponse(token, len(resp.Headers), body, len(resp.Trailers))
	h.EndCallback()
	h.resp, h.effective = nil, 0
	return h.Response
}

// ticks is the Host's model of the root context's timer
// (proxy_set_tick_period_milliseconds).
type ticks struct {
	// TickPeriods lists every period the filter set, in order (ms).
	TickPeriods []uint32
	// TickError, if set, makes SetTickPeriod fail with it, as a host
	// without timers answers UNIMPLEMENTED; TickRefused counts the calls
	// it refused.
	TickError   error
	TickRefused int
}

var _ filter.Ticker = (*Host)(nil)

// SetTickPeriod implements filter.Ticker: it records the period, or
// refuses it with TickError.
func (h *Host) SetTickPeriod(ms uint32) error {
	if h.TickError != nil {
		h.TickRefused++
		return h.TickError
	}
	h.TickPeriods = append(h.TickPeriods, ms)
	return nil
}

// TickPeriod returns the period in force: the last one set, 0 if none.
func (h *Host) TickPeriod() uint32 {
	if n := len(h.TickPeriods); n > 0 {
		return h.TickPeriods[n-1]
	}
	return 0
}

// Tick calls proxy_on_tick on the plugin's root context and returns the
// streams it continued, in order.
func (h *Host) Tick(p *filter.Plugin) []uint32 {
	h.Response = Response{}
	n := len(h.Continued)
	h.effective = 0
	p.OnTick()
	h.EndCallback()
	h.effective = 0
	return append([]uint32(nil), h.Continued[n:]...)
}

// End ends a stream as a client that leaves does: its context is gone
// (SetEffectiveContext fails for it) and the filter releases it
// (proxy_on_done, proxy_on_delete).
func (h *Host) End(s *filter.Stream, id uint32) {
	if h.Gone == nil {
		h.Gone = map[uint32]bool{}
	}
	h.Gone[id] = true
	s.Release()
	h.EndCallback()
}
