//go:build !wasip1

package dynmod

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/sharedstate/procstore"
)

// ABIVersion is what on_program_init returns: the ABI of Envoy 1.38 and
// 1.39, which 1.40 also loads (with a warning if it moved on).
const ABIVersion = "v0.1.0"

// Table sizes: configs (filter instances) alive at once, and worker
// threads per config. Handles index these tables.
const (
	maxConfigs = 256
	maxWorkers = 1024
)

var (
	env    Envoy
	store  = procstore.New()
	cfgMu  sync.Mutex
	cfgs   [maxConfigs]atomic.Pointer[config]
	errGo  = errors.New("dynmod: no current stream")
	errOff = errors.New("dynmod: the config is being destroyed")
)

// Bind sets the callbacks the binding uses; cmd/tokengate-dynmod calls it
// once, before Envoy calls any hook.
func Bind(e Envoy) { env = e }

// Store returns the process's shared data.
func Store() *procstore.Store { return store }

// config is one filter configuration (on_http_filter_config_new): its
// bytes, the counters it defined, and a worker per Envoy worker thread.
type config struct {
	idx     int
	envoy   uintptr
	raw     []byte
	mu      sync.Mutex // counters, defining, worker creation
	counter map[string]uint32
	ids     []uint64 // counter id → Envoy's id
	// defining is set while Envoy accepts metric definitions (inside
	// config_new).
	defining bool
	workers  [maxWorkers]atomic.Pointer[worker]
}

// ConfigNew is on_http_filter_config_new: it builds a worker per Envoy
// worker thread (get_concurrency; more are added on demand), each
// configured with raw, and returns the config's handle, or 0 if raw is
// invalid (Envoy then rejects the configuration).
func ConfigNew(envoyPtr uintptr, raw []byte) (h uintptr) {
	defer guard("on_http_filter_config_new", func() { h = 0 })
	c := &config{envoy: envoyPtr, raw: append([]byte(nil), raw...), counter: map[string]uint32{}, defining: true}
	n := int(env.Concurrency())
	n = min(max(n, 1), maxWorkers)
	for i := range n {
		w := newWorker(c, i)
		if !w.p.OnConfigure(c.raw) {
			return 0
		}
		c.workers[i].Store(w)
	}
	c.mu.Lock()
	c.defining = false
	c.mu.Unlock()
	cfgMu.Lock()
	defer cfgMu.Unlock()
	for i := range cfgs {
		if cfgs[i].Load() == nil {
			c.idx = i
			cfgs[i].Store(c)
			return uintptr(i + 1)
		}
	}
	env.Log(filter.LogError, "tokengate: too many dynamic-module configs alive")
	return 0
}

// ConfigDestroy is on_http_filter_config_destroy: the workers' timers are
// stopped, and no timer goroutine commits a scheduler event after it
// returns.
func ConfigDestroy(h uintptr) {
	defer guard("on_http_filter_config_destroy", nil)
	c := configOf(h)
	if c == nil {
		return
	}
	for i := range c.workers {
		if w := c.workers[i].Load(); w != nil {
			w.quiesce()
		}
	}
	cfgs[c.idx].Store(nil)
}

func configOf(h uintptr) *config {
	if h == 0 || h > maxConfigs {
		return nil
	}
	return cfgs[h-1].Load()
}

// worker returns the worker of Envoy worker i, creating it if config_new
// did not (get_concurrency answered fewer): its counters are then not
// defined (Envoy froze the definitions), and it counts nothing.
func (c *config) worker(i uint32) *worker {
	if i >= maxWorkers {
		i %= maxWorkers
	}
	if w := c.workers[i].Load(); w != nil {
		return w
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.workers[i].Load(); w != nil {
		return w
	}
	c.mu.Unlock()
	w := newWorker(c, int(i))
	w.p.OnConfigure(c.raw) // it was accepted on the main thread
	c.mu.Lock()
	c.workers[i].Store(w)
	return w
}

// defineCounter returns the id of counter name, defining it with Envoy
// while it accepts definitions; every worker shares the config's ids.
func (c *config) defineCounter(name string) (uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id, ok := c.counter[name]; ok {
		return id, nil
	}
	if !c.defining {
		return 0, errors.New("dynmod: counters are defined only in config_new")
	}
	eid, ok := env.DefineCounter(c.envoy, name)
	if !ok {
		return 0, errors.New("dynmod: Envoy refused counter " + name)
	}
	id := uint32(len(c.ids)) + 1
	c.ids = append(c.ids, eid)
	c.counter[name] = id
	return id, nil
}

// envoyCounter returns Envoy's id of counter id (0: none). The ids are
// written only in config_new, before any worker counts.
func (c *config) envoyCounter(id uint32) (uint64, bool) {
	if id == 0 || int(id) > len(c.ids) {
		return 0, false
	}
	return c.ids[id-1], true
}

// stream is one HTTP stream of a worker (a slot of its table).
type stream struct {
	s     *filter.Stream
	f     uintptr // filter_envoy_ptr
	id    uint32  // the filter's stream id: slot+1 | generation<<20
	sched uintptr // the stream's scheduler, 0 until it pauses
	// replied: the filter sent a local reply on this stream.
	replied bool
	live    bool
}

// call is a callout in flight: the filter's token, Envoy's id and the
// stream it was made on.
type call struct {
	token uint32
	id    uint64
	slot  uint32
}

// Stream ids: the slot plus one in the low bits, the slot's generation
// above, so that a reused slot gets a new id.
const (
	slotBits = 20
	slotMask = 1<<slotBits - 1
)

// worker is one Envoy worker thread's filter: its plugin, its host, its
// streams, its callouts and its timer. Everything but the timer fields is
// used by the worker's thread alone.
type worker struct {
	c    *config
	idx  int
	p    *filter.Plugin
	host whost

	streams []stream
	gens    []uint32
	free    []uint32
	calls   []call
	token   uint32

	// cur is the stream the filter's calls act on (the effective
	// context), curSlot its slot; 0 outside a stream.
	cur     uintptr
	curSlot uint32
	resp    *CallResponse // the callout answer being delivered
	// ending is the slot plus one of the stream whose response hook or
	// stream_complete is running, 0 outside: a callout it makes (a cluster
	// settlement) would die with it, as the stream ends right after its
	// response, so it goes on another live stream if there is one
	// (HTTPCall).
	ending uint32
	// owed are counts made outside a stream, by counter id, for the next
	// hook on a stream to report; owing says some are.
	owed  []uint64
	owing bool
	// During RequestHeadersNew: the stream's source address as the C side
	// read it (srcSet), and the mailbox its counts go to (box; nil
	// outside).
	src           string
	srcOK, srcSet bool
	box           *Mailbox
	// now is the wall-clock time, in nanoseconds since the Unix epoch,
	// that the C side read as it crossed into RequestHeadersNewAt: the
	// plugin's clock (worker.clock) for every callback of that crossing.
	// 0 outside one, and the clock is read in Go.
	now int64

	// The timer (filter.Ticker): a goroutine's time.Timer that, every
	// period, commits a scheduler event to a paused stream of the worker
	// (delivered as Scheduled, which runs the plugin's tick), or, with no
	// stream to deliver it, marks the tick due for the worker's next hook.
	tmu     sync.Mutex
	period  time.Duration
	timer   *time.Timer
	scheds  []uintptr // schedulers of the worker's paused streams
	target  uintptr   // the scheduler the pending tick went to
	closed  bool
	pending atomic.Bool // a tick was committed and not yet delivered
	due     atomic.Bool // a tick is due at the next hook
}

func newWorker(c *config, i int) *worker {
	w := &worker{c: c, idx: i}
	w.host.w = w
	w.host.view.S = store
	w.p = filter.NewPlugin(&w.host)
	w.p.Clock = w.clock
	return w
}

// clock is the worker's plugin's Clock: the time the C side passed with
// the crossing being run (worker.now), so that the request path reads the
// clock once, in C, instead of through time.Now (two reads of the vDSO
// clock); outside such a crossing, the wall clock, as the filter's
// default.
func (w *worker) clock() float64 {
	if w.now != 0 {
		return float64(w.now) / 1e9
	}
	return float64(time.Now().UnixNano()) / 1e9
}

// enter makes stream slot (filter pointer f) the current one, first running
// a tick that came due while no stream could take its event.
func (w *worker) enter(f uintptr, slot uint32) {
	w.host.box = nil // only finishEarly sets it, for its own call
	if w.due.Load() {
		w.due.Store(false)
		w.cur, w.curSlot = 0, 0
		w.p.OnTick()
	}
	w.cur, w.curSlot = f, slot
	if w.owing {
		w.flushCounts()
	}
}

// flushCounts reports the counts made outside a stream on the current one.
func (w *worker) flushCounts() {
	w.owing = false
	for id, n := range w.owed {
		if n == 0 {
			continue
		}
		w.owed[id] = 0
		if eid, ok := w.c.envoyCounter(uint32(id)); ok {
			env.IncrementCounter(w.cur, eid, n)
		}
	}
}

// streamOf returns the worker and slot of stream handle h: the config's
// index in its low 8 bits, the worker's in the next 16, then the stream's
// id (its slot plus one and the slot's generation, 32 bits), so that the
// handle of a released stream never reaches the stream reusing its slot.
func streamOf(h uintptr) (*worker, uint32, *stream) {
	c := cfgs[h&0xff].Load()
	id := uint32(h >> 24)
	if c == nil || id&slotMask == 0 {
		return nil, 0, nil
	}
	w := c.workers[(h>>8)&0xffff].Load()
	slot := id&slotMask - 1
	if w == nil || int(slot) >= len(w.streams) || !w.streams[slot].live || w.streams[slot].id != id {
		return nil, 0, nil
	}
	return w, slot, &w.streams[slot]
}

// FilterNew is on_http_filter_new: a stream of the worker Envoy runs it on.
// It returns the stream's handle, or 0 (Envoy then fails the stream) if the
// config is gone.
func FilterNew(cfgHandle, f uintptr) (h uintptr) {
	defer guard("on_http_filter_new", func() { h = 0 })
	return filterNew(cfgHandle, f, env.WorkerIndex(f))
}

// filterNew is FilterNew on Envoy worker wi.
func filterNew(cfgHandle, f uintptr, wi uint32) uintptr {
	h, _, _, _ := newStream(cfgHandle, f, wi)
	return h
}

// newStream is filterNew that also returns the stream's worker, slot and
// record (w nil when h is 0).
func newStream(cfgHandle, f uintptr, wi uint32) (h uintptr, w *worker, slot uint32, st *stream) {
	c := configOf(cfgHandle)
	if c == nil {
		return 0, nil, 0, nil
	}
	wi %= maxWorkers
	w = c.worker(wi)
	if n := len(w.free); n > 0 {
		slot = w.free[n-1]
		w.free = w.free[:n-1]
	} else {
		slot = uint32(len(w.streams))
		w.streams = append(w.streams, stream{})
		w.gens = append(w.gens, 0)
	}
	w.gens[slot]++
	id := (slot + 1) | (w.gens[slot]&0xfff)<<slotBits
	s := w.p.NewStream()
	s.SetID(id)
	st = &w.streams[slot]
	*st = stream{s: s, f: f, id: id, live: true}
	return uintptr(c.idx) | uintptr(wi)<<8 | uintptr(id)<<24, w, slot, st
}

// Mailbox sizes: response headers, counter increments, and the bytes of
// the headers' names and values.
const (
	MailboxHeaders = 8
	MailboxCounts  = 6
	MailboxBytes   = 800
)

// Mailbox is where RequestHeadersNew leaves work for the C side of the
// request-headers hook, so that the common request crosses from C into Go
// once and makes no call back into C: the counter increments of the hook,
// which the C side applies when the hook returns, and, for a stream
// released at once (finishEarly), the response headers it sets in its own
// response-headers hook. It is a field of the stream's C record
// (cmd/tokengate-dynmod's tg_mailbox, declared with the same layout): C
// memory, which Go only writes during the call.
type Mailbox struct {
	// NHeaders and NCounts are the entries used in Ops and Counts, BufLen
	// the bytes used in Buf; the blank field is C's padding.
	NHeaders, NCounts, BufLen uint32
	_                         uint32
	// Ops holds {add (1) or set (0), name length, value length} per
	// header, their names and values back to back in Buf (as SetHeaders).
	Ops [3 * MailboxHeaders]uint32
	// Counts holds {Envoy's counter id, delta} per increment.
	Counts [2 * MailboxCounts]uint64
	Buf    [MailboxBytes]byte
}

// RequestHeadersNew is FilterNew and RequestHeaders in one crossing from C:
// the binding's C hooks (cmd/tokengate-dynmod/hooks.c) create the Go side
// of a stream only when its request headers arrive, on Envoy worker wi
// (which the C side asked Envoy for). src is the stream's source address
// (srcOK false: Envoy has none), read by the C side before it crossed, so
// that the filter's ip: keys need no call back into C. With box, the
// hook's counter increments are left there for the C side to apply, and a
// stream whose later hooks would do nothing but set its response headers
// is finished at once (finishEarly): its headers are left in box, and the
// returned handle is 0, so that no later hook crosses into Go. It returns
// the stream's handle (0: none) and the hook's answer. The filter reads
// the wall clock itself; RequestHeadersNewAt takes the time from C.
func RequestHeadersNew(cfgHandle, f uintptr, wi uint32, end bool, src string, srcOK bool, box *Mailbox) (h uintptr, status uint32) {
	return RequestHeadersNewAt(cfgHandle, f, wi, end, src, srcOK, box, 0)
}

// RequestHeadersNewAt is RequestHeadersNew at time now, in nanoseconds
// since the Unix epoch, as the C side read the wall clock (CLOCK_REALTIME)
// before it crossed: every callback the crossing runs takes its time from
// it, and the request path never reads the clock in Go. now 0 (the C side
// could not read it) has the filter read it, as RequestHeadersNew.
func RequestHeadersNewAt(cfgHandle, f uintptr, wi uint32, end bool, src string, srcOK bool, box *Mailbox, now int64) (h uintptr, status uint32) {
	// One guard for the whole crossing (crossing.guard).
	c := crossing{box: box}
	defer c.guard(&h, &status)
	h, c.w, c.slot, c.st = newStream(cfgHandle, f, wi)
	if h == 0 {
		return 0, HeadersContinue
	}
	w := c.w
	w.src, w.srcOK, w.srcSet, w.box, w.now = src, srcOK, true, box, now
	status = w.requestHeaders(f, c.slot, c.st, end)
	w.src, w.srcOK, w.srcSet, w.box = "", false, false, nil
	if box != nil && status == HeadersContinue && c.st.s.Idle() {
		c.phase = finishing
		if w.finishEarly(&c) {
			h = 0
		}
	}
	w.now = 0
	return h, status
}

// crossing is what RequestHeadersNewAt's one guard needs to know: the
// stream it made, and how far it went.
type crossing struct {
	w     *worker
	slot  uint32
	st    *stream
	box   *Mailbox
	phase uint8
}

// The phases of a crossing that its guard tells apart.
const (
	deciding  = iota // the decision (OnRequestHeaders keeps its own recover)
	finishing        // finishEarly
	// responding: finishEarly's response headers, which the stream's
	// filter sets without a recover of its own (IdleResponseHeaders).
	responding
)

// guard is the crossing's recover. A panic fails open: the hook answers
// continue, keeping the stream if it was made (its later hooks then cross
// as usual), and response headers a failed finishEarly left in the mailbox
// are dropped. A panic while the filter set the response headers of a
// stream finishing early is instead what OnResponseHeaders' own recover
// made of it (RecoverResponseHeaders): counted and logged as a panic in
// proxy_on_response_headers, after which the stream finishes as it would
// have (finishEarly's end, under this guard again).
func (c *crossing) guard(h *uintptr, status *uint32) {
	v := recover()
	if v == nil {
		return
	}
	if c.phase == responding {
		c.phase = finishing
		c.st.s.RecoverResponseHeaders(v)
		c.resume(h, status)
		return
	}
	*status = HeadersContinue
	if w := c.w; w != nil {
		w.src, w.srcOK, w.srcSet, w.box, w.host.box = "", false, false, nil, nil
		w.cur, w.curSlot, w.now = 0, 0, 0
	}
	if c.phase == finishing && c.box != nil {
		c.box.NHeaders, c.box.BufLen = 0, 0
	}
	guarded("on_http_filter_request_headers", v)
}

// resume is the rest of finishEarly after a panic in its response
// headers, and the rest of the crossing.
func (c *crossing) resume(h *uintptr, status *uint32) {
	defer c.guard(h, status)
	if c.w.endEarly(c.slot, c.st, c.box) {
		*h = 0
	}
	c.w.now = 0
}

// finishEarly ends the crossing's stream, whose request went on, when the
// filter says its later hooks would have nothing to do but set the
// response headers (filter.Stream.Idle, which the caller checked): the
// filter computes those headers now, they are left in the mailbox for the
// C side to set when the response headers arrive, and the stream is ended
// and released (Release ends it: for an idle stream, OnDone would do
// nothing Release does not). It reports false, changing nothing the
// response hook would not redo, when the headers do not fit in the
// mailbox.
func (w *worker) finishEarly(c *crossing) bool {
	st := c.st
	w.cur, w.curSlot = st.f, c.slot
	w.host.box, w.host.boxFull = c.box, false
	c.phase = responding
	if !st.s.IdleResponseHeaders() {
		st.s.OnResponseHeaders(0, false)
	}
	c.phase = finishing
	return w.endEarly(c.slot, st, c.box)
}

// endEarly is finishEarly once the response headers are set.
func (w *worker) endEarly(slot uint32, st *stream, box *Mailbox) bool {
	w.host.box = nil
	if w.host.boxFull {
		box.NHeaders, box.BufLen = 0, 0
		w.cur, w.curSlot = 0, 0
		return false
	}
	w.cur, w.curSlot = 0, 0
	w.release(slot, st, true)
	return true
}

// RequestHeaders is on_http_filter_request_headers.
func RequestHeaders(f, h uintptr, end bool) (status uint32) {
	defer guard("on_http_filter_request_headers", func() { status = HeadersContinue })
	w, slot, st := streamOf(h)
	if w == nil {
		return HeadersContinue
	}
	return w.requestHeaders(f, slot, st, end)
}

// requestHeaders is RequestHeaders on stream st of the worker.
func (w *worker) requestHeaders(f uintptr, slot uint32, st *stream, end bool) uint32 {
	w.enter(f, slot)
	act := st.s.OnRequestHeaders(0, end)
	w.host.flushHeaders()
	if act == filter.Continue {
		return HeadersContinue
	}
	if !st.replied {
		w.paused(st) // a call, a lease or a hold resumes it
	}
	return HeadersStopAllAndWatermark
}

// RequestBody is on_http_filter_request_body.
func RequestBody(f, h uintptr, end bool) (status uint32) {
	defer guard("on_http_filter_request_body", func() { status = BodyContinue })
	w, slot, st := streamOf(h)
	if w == nil {
		return BodyContinue
	}
	w.enter(f, slot)
	if st.s.OnRequestBody(0, end) == filter.Continue {
		return BodyContinue
	}
	return BodyStopAndBuffer
}

// RequestTrailers is on_http_filter_request_trailers: the body has ended.
func RequestTrailers(f, h uintptr) (status uint32) {
	defer guard("on_http_filter_request_trailers", func() { status = TrailersContinue })
	w, slot, st := streamOf(h)
	if w == nil {
		return TrailersContinue
	}
	w.enter(f, slot)
	if st.s.OnRequestBody(filter.BodyEnded, true) == filter.Continue {
		return TrailersContinue
	}
	return TrailersStop
}

// ResponseHeaders is on_http_filter_response_headers.
func ResponseHeaders(f, h uintptr, end bool) (status uint32) {
	defer guard("on_http_filter_response_headers", func() { status = HeadersContinue })
	if w, slot, st := streamOf(h); w != nil {
		w.enter(f, slot)
		w.ending = slot + 1
		st.s.OnResponseHeaders(0, end)
		w.ending = 0
		w.host.flushHeaders()
	}
	return HeadersContinue
}

// ResponseBody is on_http_filter_response_body; the response is never
// held.
func ResponseBody(f, h uintptr, end bool) (status uint32) {
	defer guard("on_http_filter_response_body", func() { status = BodyContinue })
	if w, slot, st := streamOf(h); w != nil {
		w.enter(f, slot)
		w.ending = slot + 1
		st.s.OnResponseBody(0, end)
		w.ending = 0
		w.host.flushHeaders()
	}
	return BodyContinue
}

// ResponseTrailers is on_http_filter_response_trailers.
func ResponseTrailers(f, h uintptr) (status uint32) {
	defer guard("on_http_filter_response_trailers", func() { status = TrailersContinue })
	if w, slot, st := streamOf(h); w != nil {
		w.enter(f, slot)
		w.ending = slot + 1
		st.s.OnResponseTrailers(0)
		w.ending = 0
		w.host.flushHeaders()
	}
	return TrailersContinue
}

// StreamComplete is on_http_filter_stream_complete: the stream ended, by
// whatever path; the filter settles and releases what it holds (filter
// pointers stay valid until Destroy). A stream that left nothing behind
// (no callout in flight, no scheduler) is destroyed at once: released
// reports it, and Destroy need not be called for it (it would do
// nothing).
func StreamComplete(f, h uintptr) (released bool) {
	defer guard("on_http_filter_stream_complete", nil)
	w, slot, st := streamOf(h)
	if w == nil {
		return false
	}
	w.enter(f, slot)
	w.ending = slot + 1
	st.s.OnDone()
	w.ending, w.cur = 0, 0
	if st.sched != 0 {
		return false
	}
	for i := range w.calls {
		if w.calls[i].slot == slot {
			return false
		}
	}
	Destroy(h)
	return true
}

// Destroy is on_http_filter_destroy: Envoy cancels the stream's callouts
// without answering them, so the binding answers them as failed (the
// filter falls back as for a failed call); the stream's scheduler is
// deleted, and its slot freed.
func Destroy(h uintptr) {
	defer guard("on_http_filter_destroy", nil)
	if w, slot, st := streamOf(h); w != nil {
		w.destroy(slot, st)
	}
}

// destroy is Destroy of stream st, in slot.
func (w *worker) destroy(slot uint32, st *stream) { w.release(slot, st, false) }

// release is destroy; idle says the stream was finished early
// (filter.Stream.ReleaseIdle).
func (w *worker) release(slot uint32, st *stream, idle bool) {
	st.live = false
	w.host.dropHeaders(st.f)
	if st.sched != 0 {
		w.unpause(st.sched)
		env.SchedulerDelete(st.sched)
	}
	for i := 0; i < len(w.calls); {
		if w.calls[i].slot != slot {
			i++
			continue
		}
		token := w.calls[i].token
		w.calls[i] = w.calls[len(w.calls)-1]
		w.calls = w.calls[:len(w.calls)-1]
		w.cur, w.resp = 0, nil
		w.p.OnHTTPCallResponse(token, 0, 0, 0)
	}
	w.cur = 0
	s := st.s
	*st = stream{}
	w.free = append(w.free, slot)
	if idle {
		s.ReleaseIdle()
	} else {
		s.Release()
	}
}

// Scheduled is on_http_filter_scheduled: the worker's tick, delivered on a
// paused stream's scheduler.
func Scheduled(f, h uintptr, event uint64) {
	defer guard("on_http_filter_scheduled", nil)
	w, _, _ := streamOf(h)
	if w == nil {
		return
	}
	w.pending.Store(false)
	w.due.Store(false)
	w.cur, w.curSlot = 0, 0 // the tick runs as the root context
	w.p.OnTick()
	w.host.flushHeaders()
}

// CalloutDone is on_http_filter_http_callout_done: the answer (result
// CalloutSuccess) or failure of a callout the worker made.
func CalloutDone(f, h uintptr, id uint64, result uint32, resp *CallResponse) {
	defer guard("on_http_filter_http_callout_done", nil)
	w, slot, _ := streamOf(h)
	if w == nil {
		return
	}
	for i := range w.calls {
		if w.calls[i].id != id || w.calls[i].slot != slot {
			continue
		}
		token := w.calls[i].token
		w.calls[i] = w.calls[len(w.calls)-1]
		w.calls = w.calls[:len(w.calls)-1]
		w.cur, w.curSlot = 0, 0 // answers reach the filter as the root context's
		nh, size := 0, 0
		if result == CalloutSuccess && resp != nil {
			w.resp = resp
			nh = max(len(resp.Headers), 1)
			for _, b := range resp.Body {
				size += len(b)
			}
		}
		w.p.OnHTTPCallResponse(token, nh, size, 0)
		w.resp = nil
		w.host.flushHeaders()
		return
	}
}

// paused gives a paused stream a scheduler, so that the worker's tick can
// reach the worker through it.
func (w *worker) paused(st *stream) {
	if st.sched != 0 {
		return
	}
	st.sched = env.SchedulerNew(st.f)
	if st.sched == 0 {
		return
	}
	w.tmu.Lock()
	w.scheds = append(w.scheds, st.sched)
	w.tmu.Unlock()
}

// unpause forgets a scheduler about to be deleted; a tick committed to it
// is lost, so the tick is due at the worker's next hook instead.
func (w *worker) unpause(sched uintptr) {
	w.tmu.Lock()
	defer w.tmu.Unlock()
	for i, s := range w.scheds {
		if s == sched {
			w.scheds[i] = w.scheds[len(w.scheds)-1]
			w.scheds = w.scheds[:len(w.scheds)-1]
			break
		}
	}
	if w.target == sched && w.pending.Load() {
		w.pending.Store(false)
		w.due.Store(true)
	}
}

// setTick implements filter.Ticker.SetTickPeriod.
func (w *worker) setTick(ms uint32) error {
	w.tmu.Lock()
	defer w.tmu.Unlock()
	if w.closed {
		return errOff
	}
	w.period = time.Duration(ms) * time.Millisecond
	if ms == 0 {
		if w.timer != nil {
			w.timer.Stop()
		}
		return nil
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(w.period, w.fire)
	} else {
		w.timer.Reset(w.period)
	}
	return nil
}

// fire runs on the timer's goroutine: it commits a tick to a paused
// stream of the worker, or marks it due, and re-arms for the next period.
func (w *worker) fire() {
	w.tmu.Lock()
	defer w.tmu.Unlock()
	if w.closed || w.period == 0 {
		return
	}
	if !w.pending.Load() {
		if n := len(w.scheds); n > 0 {
			w.target = w.scheds[n-1]
			w.pending.Store(true)
			env.SchedulerCommit(w.target, 1)
		} else {
			w.due.Store(true)
		}
	}
	w.timer.Reset(w.period)
}

// quiesce stops the worker's timer for good: when it returns, no timer
// goroutine commits an event any more.
func (w *worker) quiesce() {
	w.tmu.Lock()
	defer w.tmu.Unlock()
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// guard is every hook's last line of defence: a panic that crossed into
// Envoy would abort it, so it is logged and the hook answers fail (fail
// open).
func guard(hook string, fail func()) {
	v := recover()
	if v == nil {
		return
	}
	if fail != nil {
		fail()
	}
	guarded(hook, v)
}

// guarded logs v, a panic guard recovered in hook.
func guarded(hook string, v any) {
	msg := "tokengate: recovered panic in " + hook + ", failing open"
	if s, ok := v.(string); ok {
		msg += ": " + s
	} else if e, ok := v.(error); ok {
		msg += ": " + e.Error()
	}
	if env != nil {
		env.Log(filter.LogCritical, msg)
	}
}
