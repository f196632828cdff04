//go:build !wasip1

package filter_test

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/ratelimitheader"
)

// headerSetter is a filtertest.Host that sets the RateLimit headers itself
// (as filter/dynmod does): it records each call as the bytes
// ratelimitheader.AppendHeaders writes, and panics on the request panicAt.
type headerSetter struct {
	*filtertest.Host
	calls   []string
	n       int
	panicAt int
}

func (h *headerSetter) SetRateLimitHeaders(quotas []ratelimitheader.Quota, best int) {
	h.n++
	if h.n == h.panicAt {
		panic("headers " + strconv.Itoa(h.n))
	}
	b, ops := ratelimitheader.AppendHeaders(nil, nil, quotas, best)
	h.calls = append(h.calls, fmt.Sprintf("%s %v", b, ops))
}

// TestIdleResponseHeaders: for every idle stream, IdleResponseHeaders sets
// what OnResponseHeaders sets, and a panic in it handed to
// RecoverResponseHeaders is logged and counted as OnResponseHeaders' own
// recover does; a stream that is not idle is left to OnResponseHeaders.
// ReleaseIdle (without OnDone) leaves the plugin as OnDone and Release do:
// the later requests are decided alike, a concurrency rule's place in
// flight (a stream not idle) released. Requests admitted and rejected,
// rules that apply and do not, one rule and several, RateLimit headers on
// and off, fixed windows, settling and concurrency rules.
func TestIdleResponseHeaders(t *testing.T) {
	configs := []string{
		`{"rules":[{"name":"a","limit_keys":["header:x-a"],"algorithm_config":{"rps":2,"burst":3}}]}`,
		`{"rules":[{"name":"a","limit_keys":["header:x-a"],"algorithm_config":{"rps":2,"burst":3}},` +
			`{"name":"b","limit_keys":["header:x-b"],"algorithm_config":{"rps":1,"burst":2}}]}`,
		`{"settings":{"ratelimit_headers":false},"rules":[{"name":"a","limit_keys":["header:x-a"],"algorithm_config":{"rps":2,"burst":3}}]}`,
		`{"rules":[{"name":"w","algorithm":"fixed_window","limit_keys":["header:x-a"],"algorithm_config":{"limit":4,"window_seconds":2}}]}`,
		`{"rules":[{"name":"s","limit_keys":["header:x-a"],"algorithm_config":{"rps":2,"burst":3,"count_statuses":[200]}}]}`,
		`{"rules":[{"name":"cc","algorithm":"concurrency","limit_keys":["header:x-a"],"algorithm_config":{"max_in_flight":1}},` +
			`{"name":"b","limit_keys":["header:x-b"],"algorithm_config":{"rps":1,"burst":2}}]}`,
	}
	reqs := []filtertest.Request{
		filtertest.Get("/", "10.0.0.1:1", "x-a", "k"),
		filtertest.Get("/", "10.0.0.1:1", "x-a", "k", "x-b", "j"),
		filtertest.Get("/", "10.0.0.1:1"),
		filtertest.Get("/", "10.0.0.1:1", "x-b", "j"),
	}
	for ci, cfg := range configs {
		for _, panicAt := range []int{0, 2, 5} {
			// Two plugins, identical but for the call that sets a finished
			// request's response headers.
			var hosts [2]*headerSetter
			var plugins [2]*filter.Plugin
			now := 1736940000.0
			for i := range hosts {
				hosts[i] = &headerSetter{Host: filtertest.New(), panicAt: panicAt}
				plugins[i] = filter.NewPlugin(hosts[i])
				plugins[i].Clock = func() float64 { return now }
				if !plugins[i].OnConfigure([]byte(cfg)) {
					t.Fatalf("config %d refused: %q", ci, hosts[i].Logs(filter.LogWarn))
				}
			}
			for n := range 24 {
				now += 0.125
				req := reqs[n%len(reqs)]
				var idle [2]bool
				for i, h := range hosts {
					p := plugins[i]
					h.Request, h.Response = req, filtertest.Response{}
					s := p.NewStream()
					s.OnRequestHeaders(len(req.Headers), true)
					h.EndCallback()
					if h.Response.Local != nil {
						s.Release()
						continue
					}
					idle[i] = s.Idle()
					if i == 1 && idle[i] {
						func() {
							defer func() {
								if v := recover(); v != nil {
									s.RecoverResponseHeaders(v)
								}
							}()
							if !s.IdleResponseHeaders() {
								t.Fatal("IdleResponseHeaders refused a host that sets the headers")
							}
						}()
					} else {
						s.OnResponseHeaders(0, false)
					}
					h.EndCallback()
					if i == 1 {
						s.ReleaseIdle() // idle or not: a stream not idle is released in full
						continue
					}
					s.OnDone()
					s.Release()
				}
				if idle[0] != idle[1] {
					t.Fatalf("config %d request %d: idle %v", ci, n, idle)
				}
			}
			a, b := hosts[0], hosts[1]
			if fmt.Sprint(a.calls) != fmt.Sprint(b.calls) || len(a.calls) == 0 && ci != 2 {
				t.Fatalf("config %d panic at %d: headers\n%q\nwant\n%q", ci, panicAt, b.calls, a.calls)
			}
			if la, lb := fmt.Sprint(a.Logs(filter.LogDebug)), fmt.Sprint(b.Logs(filter.LogDebug)); la != lb {
				t.Fatalf("config %d panic at %d: logs\n%s\nwant\n%s", ci, panicAt, lb, la)
			}
			pa, _ := a.Counter(filter.MetricPanics)
			pb, _ := b.Counter(filter.MetricPanics)
			want := int64(0)
			if panicAt > 0 && a.n >= panicAt {
				want = 1
			}
			if pa != want || pb != want {
				t.Fatalf("config %d panic at %d: panics %d and %d, want %d", ci, panicAt, pb, pa, want)
			}
		}
	}
}
