//go:build !wasip1

package dynmod

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/sharedstate/procstore"
)

// fakeEnvoy is a minimal Envoy for the binding's own tests: streams are
// indices into a table (the filter pointers), headers are slices. The C
// host (e2e/dynmod) is the judge of the built library; this fake only
// lets the binding be measured and raced in-process.
type fakeEnvoy struct {
	mu      sync.Mutex
	streams []*fakeStream
	workers uint32
	logs    []string
}

type fakeStream struct {
	worker    uint32
	req, resp [][2]string
	local     uint32
	continued bool
	sets      int // response headers set or added
}

func (e *fakeEnvoy) stream(f uintptr) *fakeStream {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.streams[f-1]
}

func (e *fakeEnvoy) newStream(worker uint32, req [][2]string) uintptr {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.streams = append(e.streams, &fakeStream{worker: worker, req: req})
	return uintptr(len(e.streams))
}

func (e *fakeEnvoy) Concurrency() uint32          { return e.workers }
func (e *fakeEnvoy) WorkerIndex(f uintptr) uint32 { return e.stream(f).worker }
func (e *fakeEnvoy) Log(level filter.LogLevel, msg string) {
	if level >= filter.LogWarn {
		e.mu.Lock()
		e.logs = append(e.logs, msg)
		e.mu.Unlock()
	}
}
func (e *fakeEnvoy) DefineCounter(cfg uintptr, name string) (uint64, bool) { return 1, true }
func (e *fakeEnvoy) IncrementCounter(f uintptr, id, delta uint64)          {}
func (e *fakeEnvoy) Header(f uintptr, kind HeaderKind, name string, index int) (string, int, bool) {
	s := e.stream(f)
	hs := s.req
	if kind == ResponseHeader {
		hs = s.resp
	}
	n, v, ok := 0, "", false
	for _, h := range hs {
		if h[0] == name {
			if n == index {
				v, ok = h[1], true
			}
			n++
		}
	}
	return v, n, ok
}
func (e *fakeEnvoy) SetHeader(f uintptr, kind HeaderKind, name, value string) {}
func (e *fakeEnvoy) AddHeader(f uintptr, kind HeaderKind, name, value string) {}
func (e *fakeEnvoy) SetHeaders(f uintptr, kind HeaderKind, buf []byte, ops []uint32) {
	n := 0
	for i := 0; i+2 < len(ops); i += 3 {
		n += int(ops[i+1] + ops[i+2])
	}
	if n != len(buf) {
		panic("SetHeaders: the lengths do not add up to the buffer")
	}
	e.stream(f).sets += len(ops) / 3
}
func (e *fakeEnvoy) SendResponse(f uintptr, status uint32, hs [][2]string, body []byte, details string) {
	e.stream(f).local = status
}
func (e *fakeEnvoy) ContinueDecoding(f uintptr)             { e.stream(f).continued = true }
func (e *fakeEnvoy) SourceAddress(f uintptr) (string, bool) { return "10.0.0.1:4000", true }
func (e *fakeEnvoy) Callout(f uintptr, cluster string, hs [][2]string, body []byte, ms uint64) (uint64, bool) {
	return 0, false
}
func (e *fakeEnvoy) SchedulerNew(f uintptr) uintptr       { return 0 }
func (e *fakeEnvoy) SchedulerCommit(s uintptr, ev uint64) {}
func (e *fakeEnvoy) SchedulerDelete(s uintptr)            {}

// request runs one request through the hooks on stream f, reused: it
// reports whether the filter admitted it.
func request(cfg, f uintptr, s *fakeStream) bool {
	s.local, s.continued = 0, false
	h := FilterNew(cfg, f)
	ok := RequestHeaders(f, h, true) == HeadersContinue && s.local == 0
	if ok {
		ResponseHeaders(f, h, true)
	}
	StreamComplete(f, h)
	Destroy(h)
	return ok
}

const oneRule = `{"rules":[{"name":"r","limit_keys":["header:x-key"],"algorithm_config":{"rps":1000000,"burst":1000000}}]}`

// TestNoAllocsPerRequest: in steady state a request admitted by one rule
// allocates nothing in the binding and the filter together.
func TestNoAllocsPerRequest(t *testing.T) {
	e := &fakeEnvoy{workers: 1}
	bind(e)
	cfg := ConfigNew(1, []byte(oneRule))
	if cfg == 0 {
		t.Fatalf("config refused: %q", e.logs)
	}
	defer ConfigDestroy(cfg)
	f := e.newStream(0, [][2]string{{"x-key", "k"}})
	s := e.stream(f)
	for range 100 {
		request(cfg, f, s)
	}
	s.sets = 0
	allocs := testing.AllocsPerRun(2000, func() {
		if !request(cfg, f, s) {
			t.Fatal("rejected")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per request, want 0", allocs)
	}
	if s.sets < 2001*4 { // RateLimit-Limit, -Remaining, -Reset, RateLimit, RateLimit-Policy
		t.Fatalf("%d response headers set over 2001 requests, want the RateLimit headers on each", s.sets)
	}
}

// TestWorkersShareBuckets: 8 workers on 8 goroutines take from one key
// with time frozen... by a burst no refill can matter for: exactly the
// burst is admitted, under -race, through the hooks.
func TestWorkersShareBuckets(t *testing.T) {
	const workers, each = 8, 300
	e := &fakeEnvoy{workers: workers}
	bind(e)
	cfg := ConfigNew(1, []byte(`{"rules":[{"name":"shared","limit_keys":["header:x-key"],"algorithm_config":{"rps":0.001,"burst":1000}}]}`))
	if cfg == 0 {
		t.Fatalf("config refused: %q", e.logs)
	}
	defer ConfigDestroy(cfg)
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for w := range workers {
		f := e.newStream(uint32(w), [][2]string{{"x-key", "hot"}})
		s := e.stream(f)
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for range each {
				if request(cfg, f, s) {
					n++
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if admitted != 1000 {
		t.Fatalf("admitted %d of %d, want the burst, 1000; logs %q", admitted, workers*each, strings.Join(e.logs, "\n"))
	}
}

func BenchmarkRequest(b *testing.B) {
	e := &fakeEnvoy{workers: 1}
	bind(e)
	cfg := ConfigNew(1, []byte(oneRule))
	defer ConfigDestroy(cfg)
	f := e.newStream(0, [][2]string{{"x-key", "k"}})
	s := e.stream(f)
	b.ReportAllocs()
	for b.Loop() {
		request(cfg, f, s)
	}
}

// BenchmarkRequestMailbox is the request as the C side of the hooks makes
// it (cmd/tokengate-dynmod/hooks.c): one crossing, RequestHeadersNew with
// the source address and a mailbox, one per-IP rule that admits it, the
// stream finished at once. Its CPU profile is the dynamic module's PGO
// profile (cmd/tokengate-dynmod/dynmod.pgo; see docs/deploy/dynamic-module.md).
func BenchmarkRequestMailbox(b *testing.B) {
	e := &fakeEnvoy{workers: 1}
	bind(e)
	// The rule admits ten million a second: a long -benchtime (the profile
	// takes 15 s) outruns a million.
	cfg := ConfigNew(1, []byte(`{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":10000000,"burst":10000000}}]}`))
	defer ConfigDestroy(cfg)
	f := e.newStream(0, nil)
	var box Mailbox
	b.ReportAllocs()
	for b.Loop() {
		box.NHeaders, box.NCounts, box.BufLen = 0, 0, 0
		if h, st := RequestHeadersNew(cfg, f, 0, true, "10.0.0.1:4000", true, &box); h != 0 || st != HeadersContinue {
			b.Fatalf("handle %d, status %d: want the stream finished at once", h, st)
		}
	}
}

// boxHeaders decodes the response headers left in a mailbox.
func boxHeaders(b *Mailbox) map[string]string {
	hs := map[string]string{}
	off := uint32(0)
	for i := range b.NHeaders {
		kl, vl := b.Ops[3*i+1], b.Ops[3*i+2]
		hs[string(b.Buf[off:off+kl])] = string(b.Buf[off+kl : off+kl+vl])
		off += kl + vl
	}
	return hs
}

// TestMailboxFinishesIdleStream: through RequestHeadersNew with a mailbox,
// an admitted request whose later hooks would only set its RateLimit
// headers is finished in the one crossing (no handle comes back, so no
// later hook crosses), its headers and counts are left in the mailbox, and
// it allocates nothing; a rejected request and one that settles after the
// response keep their Go side and leave no headers.
func TestMailboxFinishesIdleStream(t *testing.T) {
	e := &fakeEnvoy{workers: 1}
	bind(e)
	cfg := ConfigNew(1, []byte(`{"rules":[{"name":"r","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":3}},`+
		`{"name":"s","limit_keys":["header:x-settle"],"algorithm_config":{"rps":1000,"burst":1000,"count_statuses":[200]}}]}`))
	if cfg == 0 {
		t.Fatalf("config refused: %q", e.logs)
	}
	defer ConfigDestroy(cfg)
	f := e.newStream(0, nil)
	s := e.stream(f)
	var box Mailbox
	for i, want := range []string{"2", "1", "0"} {
		h, st := RequestHeadersNew(cfg, f, 0, true, "10.0.0.9:1234", true, &box)
		if h != 0 || st != HeadersContinue || s.local != 0 {
			t.Fatalf("request %d: handle %d status %d reply %d, want 0, continue, none", i, h, st, s.local)
		}
		hs := boxHeaders(&box)
		if got := hs["ratelimit-remaining"]; got != want || box.NHeaders != 5 || hs["ratelimit-policy"] == "" {
			t.Fatalf("request %d: mailbox headers %v, want 5 with ratelimit-remaining %s", i, hs, want)
		}
		if box.NCounts == 0 || box.Counts[1] != 1 {
			t.Fatalf("request %d: %d counts (%v), want the increments of the hook (allowed: 1)", i, box.NCounts, box.Counts[:2])
		}
		box = Mailbox{}
	}
	h, _ := RequestHeadersNew(cfg, f, 0, true, "10.0.0.9:1234", true, &box)
	if h == 0 || s.local != 429 || box.NHeaders != 0 {
		t.Fatalf("4th request: handle %d reply %d, %d mailbox headers; want a live stream, 429, none", h, s.local, box.NHeaders)
	}
	StreamComplete(f, h)
	Destroy(h)

	s.req, s.local, box = [][2]string{{"x-settle", "a"}}, 0, Mailbox{}
	h, _ = RequestHeadersNew(cfg, f, 0, true, "10.0.0.10:1234", true, &box)
	if h == 0 || box.NHeaders != 0 {
		t.Fatalf("settling request: handle %d, %d mailbox headers; want a live stream and none", h, box.NHeaders)
	}
	StreamComplete(f, h)
	Destroy(h)

	// Headers too long for the mailbox: the stream keeps its Go side, and
	// its response hook sets them.
	var rules []string
	for i := range 24 {
		rules = append(rules, `{"name":"a-rather-long-rule-name-`+strconv.Itoa(i)+`","limit_keys":["ip:address"],"algorithm_config":{"rps":1000,"burst":1000}}`)
	}
	long := ConfigNew(1, []byte(`{"rules":[`+strings.Join(rules, ",")+`]}`))
	if long == 0 {
		t.Fatalf("config refused: %q", e.logs)
	}
	defer ConfigDestroy(long)
	box = Mailbox{}
	h, _ = RequestHeadersNew(long, f, 0, true, "10.0.0.12:1234", true, &box)
	if h == 0 || box.NHeaders != 0 || box.BufLen != 0 {
		t.Fatalf("long headers: handle %d, %d mailbox headers; want a live stream and none", h, box.NHeaders)
	}
	before := s.sets
	ResponseHeaders(f, h, true)
	if s.sets-before != 5 {
		t.Fatalf("long headers: the response hook set %d headers, want 5", s.sets-before)
	}
	StreamComplete(f, h)
	Destroy(h)

	// Steady state: nothing allocates on the mailbox path.
	perIP := ConfigNew(1, []byte(`{"rules":[{"name":"r","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}]}`))
	if perIP == 0 {
		t.Fatalf("config refused: %q", e.logs)
	}
	defer ConfigDestroy(perIP)
	s.req = nil
	run := func() {
		box.NHeaders, box.NCounts, box.BufLen = 0, 0, 0
		if h, _ := RequestHeadersNew(perIP, f, 0, true, "10.0.0.11:1", true, &box); h != 0 || box.NHeaders != 5 {
			t.Fatalf("handle %d, %d mailbox headers; want 0 and 5", h, box.NHeaders)
		}
	}
	for range 100 {
		run()
	}
	if allocs := testing.AllocsPerRun(1000, run); allocs != 0 {
		t.Fatalf("%v allocations per request through the mailbox, want 0", allocs)
	}
}

// TestRequestHeadersNewAtTakesTheTimeFromC: the time the C side passes
// with the crossing is the filter's clock for the whole crossing (the
// bucket refills by it, not by the wall clock), and only for it: after
// the crossing the worker's clock is the wall clock again; 0 reads the
// wall clock.
func TestRequestHeadersNewAtTakesTheTimeFromC(t *testing.T) {
	e := &fakeEnvoy{workers: 1}
	bind(e)
	cfg := ConfigNew(1, []byte(`{"rules":[{"name":"r","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":1}}]}`))
	if cfg == 0 {
		t.Fatalf("config refused: %q", e.logs)
	}
	defer ConfigDestroy(cfg)
	f := e.newStream(0, nil)
	s := e.stream(f)
	// A time ten years from now, whole seconds apart: the wall clock
	// would neither refill the bucket between the requests nor agree
	// with the RateLimit-Reset the headers state.
	t0 := time.Now().Add(10 * 365 * 24 * time.Hour).UnixNano()
	tests := []struct {
		now       int64
		admitted  bool
		remaining string
	}{
		{t0, true, "0"},
		{t0, false, ""},                 // the same instant: empty
		{t0 + 999_000_000, false, ""},   // 0.999 s later: not a whole token
		{t0 + 1_000_000_000, true, "0"}, // 1 s later: one token
		{t0 + 5_000_000_000, true, "0"}, // 4 s later: full (burst 1)
		{t0 + 5_000_000_000, false, ""}, // and empty again
		{t0 + 7_500_000_000, true, "0"}, // 2.5 s later
	}
	for i, tc := range tests {
		var box Mailbox
		s.local = 0
		h, st := RequestHeadersNewAt(cfg, f, 0, true, "10.1.2.3:5", true, &box, tc.now)
		admitted := st == HeadersContinue && s.local == 0
		if admitted != tc.admitted {
			t.Fatalf("request %d at t0%+d ns: admitted %v (reply %d), want %v", i, tc.now-t0, admitted, s.local, tc.admitted)
		}
		if admitted {
			hs := boxHeaders(&box)
			if h != 0 || hs["ratelimit-remaining"] != tc.remaining || hs["ratelimit-reset"] != "1" {
				t.Fatalf("request %d: handle %d, headers %v; want finished, remaining %s, reset 1", i, h, hs, tc.remaining)
			}
			continue
		}
		StreamComplete(f, h)
		Destroy(h)
	}
	w := configOf(cfg).worker(0)
	if w.now != 0 {
		t.Fatalf("after the crossing the worker's time is %d, want 0 (the wall clock)", w.now)
	}
	before := float64(time.Now().UnixNano()) / 1e9
	got := w.clock()
	after := float64(time.Now().UnixNano()) / 1e9
	if got < before || got > after {
		t.Fatalf("outside a crossing the clock read %f, want the wall clock, in [%f, %f]", got, before, after)
	}
	// now 0: the filter reads the wall clock, ten years before t0: a fresh
	// key's one token goes, the next request at once finds none, and one
	// at t0 finds the bucket refilled.
	for i, tc := range []struct {
		now      int64
		admitted bool
	}{{0, true}, {0, false}, {t0, true}} {
		var box Mailbox
		s.local = 0
		h, st := RequestHeadersNewAt(cfg, f, 0, true, "10.1.2.4:5", true, &box, tc.now)
		if admitted := st == HeadersContinue && s.local == 0; admitted != tc.admitted {
			t.Fatalf("wall clock, request %d: admitted %v, want %v", i, admitted, tc.admitted)
		}
		if h != 0 {
			StreamComplete(f, h)
			Destroy(h)
		}
		if w.now != 0 {
			t.Fatalf("wall clock, request %d: after the crossing the worker's time is %d, want 0", i, w.now)
		}
	}
}

// countingEnvoy is fakeEnvoy with counters Envoy tells apart, by name.
type countingEnvoy struct {
	*fakeEnvoy
	names  []string
	counts map[string]uint64
}

func (e *countingEnvoy) DefineCounter(cfg uintptr, name string) (uint64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.names = append(e.names, name)
	return uint64(len(e.names)), true
}

func (e *countingEnvoy) IncrementCounter(f uintptr, id, delta uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.counts[e.names[id-1]] += delta
}

// TestMailboxPanicInResponseHeaders: a panic while the one crossing sets
// an idle stream's response headers (here a mailbox whose length is out of
// range) is what a panic in proxy_on_response_headers is: logged and
// counted as one in that callback, the headers left out, and the stream
// finished all the same; the next request goes through.
func TestMailboxPanicInResponseHeaders(t *testing.T) {
	e := &countingEnvoy{fakeEnvoy: &fakeEnvoy{workers: 1}, counts: map[string]uint64{}}
	bind(e)
	defer Bind(e.fakeEnvoy)
	cfg := ConfigNew(1, []byte(`{"rules":[{"name":"r","limit_keys":["ip:address"],"algorithm_config":{"rps":1000,"burst":1000}}]}`))
	if cfg == 0 {
		t.Fatalf("config refused: %q", e.logs)
	}
	defer ConfigDestroy(cfg)
	f := e.newStream(0, nil)
	for i, bufLen := range []uint32{0, MailboxBytes + 1, 0, MailboxBytes + 1, 0} {
		logs, panics := len(e.logs), e.counts[filter.MetricPanics]
		box := Mailbox{BufLen: bufLen}
		h, st := RequestHeadersNewAt(cfg, f, 0, true, "10.2.0.1:1", true, &box, time.Now().UnixNano())
		if h != 0 || st != HeadersContinue {
			t.Fatalf("request %d: handle %d status %d, want the stream finished, continue", i, h, st)
		}
		for k := range box.NCounts { // the C side's increments
			e.IncrementCounter(f, box.Counts[2*k], box.Counts[2*k+1])
		}
		if bufLen == 0 {
			if box.NHeaders != 5 || len(e.logs) != logs || e.counts[filter.MetricPanics] != panics {
				t.Fatalf("request %d: %d headers, logs %q, want 5 and no panic", i, box.NHeaders, e.logs[logs:])
			}
			continue
		}
		const want = "tokengate: recovered panic in proxy_on_response_headers, failing open: runtime error: slice bounds out of range"
		if len(e.logs) != logs+1 || !strings.HasPrefix(e.logs[logs], want) {
			t.Fatalf("request %d: logs %q, want one line %q...", i, e.logs[logs:], want)
		}
		if got := e.counts[filter.MetricPanics]; got != panics+1 {
			t.Fatalf("request %d: %s %d, want %d", i, filter.MetricPanics, got, panics+1)
		}
		if box.NHeaders != 0 || box.BufLen != bufLen {
			t.Fatalf("request %d: mailbox %d headers, %d bytes; want it untouched", i, box.NHeaders, box.BufLen)
		}
	}
	if got := e.counts["tokengate.rule.r.allowed"]; got != 5 {
		t.Fatalf("allowed %d, want 5 (counts %v)", got, e.counts)
	}
}

// bind binds e for a test and gives it an empty store: the store is the
// process's, and a test run again (go test -count N) must not find the
// buckets its previous run drained.
func bind(e Envoy) {
	Bind(e)
	store = procstore.New()
}
