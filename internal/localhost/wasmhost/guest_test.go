package wasmhost_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/hostguest"
)

// guestWasm is testdata/guest built as a wasip1 reactor (hostguest.Wasm).
var guestWasm []byte

func TestMain(m *testing.M) {
	var err error
	if guestWasm, err = hostguest.Wasm(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func discard(wasmhost.LogLevel, string) {}

// newGuestHost starts the test guest with opts and serves it over
// loopback, behind a proxy with popts if given (a pause timeout).
func newGuestHost(t *testing.T, opts wasmhost.Options, popts ...proxy.Options) (*wasmhost.Host, *httptest.Server) {
	t.Helper()
	var po proxy.Options
	if len(popts) > 0 {
		po = popts[0]
	}
	h := hostguest.Start(t, opts)
	srv := httptest.NewServer(proxy.New(h, po))
	t.Cleanup(srv.Close)
	return h, srv
}

type reply struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, srv *httptest.Server, method, path string, header map[string]string, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func test(t *testing.T, srv *httptest.Server, what string) reply {
	t.Helper()
	return do(t, srv, "GET", "/p?q=1", map[string]string{"x-test": what}, "")
}

func TestGuestStartFailures(t *testing.T) {
	tests := []struct {
		name        string
		opts        wasmhost.Options
		expectedErr []string
	}{
		{
			name: "configure false",
			opts: wasmhost.Options{PluginConfig: []byte("fail")},
			expectedErr: []string{`plugin "guest" rejected its configuration: proxy_on_configure returned false`,
				`the filter said: bad config: "fail"`},
		},
		{
			name:        "vm start false",
			opts:        wasmhost.Options{VMConfig: []byte("fail")},
			expectedErr: []string{`proxy_on_vm_start returned false`, `the filter said: vm config says fail`},
		},
		{
			name:        "store semantics mismatch",
			opts:        wasmhost.Options{Kong: true, Store: wasmhost.NewSharedData(false)},
			expectedErr: []string{"Options.Store has envoy semantics but the host runs in kong mode"},
		},
		{
			name:        "not wasm",
			opts:        wasmhost.Options{Wasm: []byte("nope")},
			expectedErr: []string{"host: compile:"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if opts.Wasm == nil {
				opts.Wasm = guestWasm
			}
			opts.PluginName, opts.LogSink, opts.Workers = "guest", discard, 2
			h, err := wasmhost.New(context.Background(), opts)
			if err == nil {
				h.Close(context.Background())
				t.Fatal("New succeeded, want an error")
			}
			for _, want := range tc.expectedErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// wasmWithImports returns a minimal module importing the given env
// functions, each of type (i32) -> i32.
func wasmWithImports(names ...string) []byte {
	leb := func(n int) []byte { // n < 128
		return []byte{byte(n)}
	}
	section := func(id byte, body []byte) []byte {
		return append(append([]byte{id}, leb(len(body))...), body...)
	}
	types := []byte{1, 0x60, 1, 0x7f, 1, 0x7f}
	imports := []byte{byte(len(names))}
	for _, n := range names {
		imports = append(imports, 3, 'e', 'n', 'v')
		imports = append(imports, leb(len(n))...)
		imports = append(imports, n...)
		imports = append(imports, 0, 0) // func, type 0
	}
	out := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	out = append(out, section(1, types)...)
	return append(out, section(2, imports)...)
}

func TestImportCheck(t *testing.T) {
	_, err := wasmhost.New(context.Background(), wasmhost.Options{
		Wasm:    wasmWithImports("proxy_log", "proxy_get_log_level", "proxy_nope"),
		LogSink: discard,
	})
	want := "host: module imports functions the host does not provide; missing (1): env.proxy_nope; " +
		"wrong signature (1): env.proxy_log: module wants (i32) -> (i32), host provides (i32,i32,i32) -> (i32)"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	_, err = wasmhost.New(context.Background(), wasmhost.Options{Wasm: wasmWithImports(), LogSink: discard})
	if err == nil || !strings.Contains(err.Error(), "does not export proxy_abi_version_0_2_1") {
		t.Fatalf("got %v, want a missing ABI marker error", err)
	}
}

func TestGuestRequests(t *testing.T) {
	clk := wasmhost.NewFakeClock(time.Unix(1_700_000_000, 123))
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 2, Walltime: clk.Walltime, Nanotime: clk.Nanotime,
		PluginConfig: []byte("cfg-1"), VMID: "vm", RootID: "root"}, proxy.Options{PauseTimeout: 200 * time.Millisecond})

	tests := []struct {
		name       string
		method     string
		header     map[string]string
		body       string
		status     int
		headers    map[string]string // expected response headers ("" = absent)
		bodyHas    string
		resultHas  []string
		resultFunc func(t *testing.T, result string)
	}{
		{
			name: "pass through", header: map[string]string{"x-test": "none"}, status: 200,
			headers: map[string]string{"X-Status-Seen": "200", "X-Eos": "0", "Content-Type": "application/json", "X-Result": ""},
			bodyHas: `"path": "/p?q=1"`,
		},
		{
			name: "local reply runs response callbacks", header: map[string]string{"x-test": "local"}, status: 429,
			headers: map[string]string{"X-Local": "yes", "Retry-After": "1", "Content-Type": "text/plain",
				"X-Status-Seen": "429", "X-Eos": "0", "X-Result": "send=0"},
			bodyHas: "slow down\n",
		},
		{
			name: "grpc local reply", header: map[string]string{"x-test": "grpc", "content-type": "application/grpc"}, status: 200,
			headers: map[string]string{"Content-Type": "application/grpc", "Grpc-Status": "14",
				"Grpc-Message": "too many%0A", "X-Status-Seen": "200", "X-Eos": "1"},
		},
		{
			name: "grpc explicit status", header: map[string]string{"x-test": "grpc-status", "content-type": "application/grpc+proto"},
			status: 200, headers: map[string]string{"Grpc-Status": "8"},
		},
		{
			name: "grpc status ignored for http", header: map[string]string{"x-test": "grpc-status"}, status: 429,
			headers: map[string]string{"Grpc-Status": "", "Content-Type": ""},
		},
		{name: "pause without reply", header: map[string]string{"x-test": "pause"}, status: 504, bodyHas: "never resumed"},
		{name: "bad pointers", header: map[string]string{"x-test": "badptr"}, status: 200, resultHas: []string{"6,6,6,6,6"}},
		{name: "header pairs", header: map[string]string{"x-test": "pairs", "a": "1", "b": "2"}, status: 200,
			// :authority :path :method :scheme accept-encoding a b user-agent x-test x-forwarded-proto x-request-id
			resultHas: []string{"0,11"}},
		{name: "edit request headers", header: map[string]string{"x-test": "edit", "x-replace": "old", "x-remove": "gone"}, status: 200,
			bodyHas: `"x-added": [`},
		{name: "wrong map in each phase", header: map[string]string{"x-test": "wrong-map"}, status: 200, resultHas: []string{"2,2"}},
		{name: "fake clock", header: map[string]string{"x-test": "time"}, status: 200, resultHas: []string{"1700000000000000123"}},
		// start/max are honoured; past the end is empty with pointer 0; the
		// request body outside its callback is NOT_FOUND; type 9 BAD_ARGUMENT.
		{name: "plugin config", header: map[string]string{"x-test": "config"}, status: 200,
			resultFunc: func(t *testing.T, result string) {
				if !regexp.MustCompile(`^cfg-1,g-1/0/[1-9][0-9]*,1/0/[1-9][0-9]*,/0/0,1,2$`).MatchString(result) {
					t.Errorf("x-result %q", result)
				}
			}},
		{name: "request body", method: "POST", header: map[string]string{"x-test": "body"}, body: "hello", status: 200,
			resultHas: []string{"body=hello/0,reqmap=2"}},
		{name: "head", method: "HEAD", header: map[string]string{"x-test": "local"}, status: 429,
			headers: map[string]string{"Content-Length": "10", "X-Eos": "1"}},
		{
			name: "properties", header: map[string]string{"x-test": "props"}, status: 200,
			resultFunc: func(t *testing.T, result string) {
				host := strings.TrimPrefix(srv.URL, "http://")
				for _, want := range []string{
					"source.address=127.0.0.1:", "request.path=/p?q=1/0", "request.url_path=/p/0",
					"request.host=" + host + "/0", "request.method=GET/0", "request.scheme=http/0", "plugin_name=guest/0",
					"plugin_vm_id=vm/0", "plugin_root_id=root/0", "no.such=/1", "source.address=/1", "request.id=36/0",
				} {
					if !strings.Contains(result, want) {
						t.Errorf("x-result %q lacks %q", result, want)
					}
				}
				if !strings.Contains(result, ",source.port=") || strings.Contains(result, "source.port=/") {
					t.Errorf("x-result %q: want a numeric source.port", result)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = "GET"
			}
			if tc.header["x-test"] == "body" {
				tc.header["x-test"] = "none"
			}
			r := do(t, srv, method, "/p?q=1", tc.header, tc.body)
			if r.status != tc.status {
				t.Fatalf("status: got %d, want %d (body %q)", r.status, tc.status, r.body)
			}
			for k, want := range tc.headers {
				if got := r.header.Get(k); got != want {
					t.Errorf("header %s: got %q, want %q", k, got, want)
				}
			}
			if !strings.Contains(r.body, tc.bodyHas) {
				t.Errorf("body %q lacks %q", r.body, tc.bodyHas)
			}
			result := r.header.Get("X-Result")
			for _, want := range tc.resultHas {
				if !strings.Contains(result, want) {
					t.Errorf("x-result %q lacks %q", result, want)
				}
			}
			if tc.resultFunc != nil {
				tc.resultFunc(t, result)
			}
		})
	}

	t.Run("edit reached upstream", func(t *testing.T) {
		r := do(t, srv, "GET", "/", map[string]string{"x-test": "edit", "x-replace": "old", "x-remove": "gone"}, "")
		var e proxy.Echo
		if err := json.Unmarshal([]byte(r.body), &e); err != nil {
			t.Fatalf("echo body %q: %v", r.body, err)
		}
		if got := e.Headers["x-added"]; len(got) != 1 || got[0] != "1" {
			t.Errorf("x-added: got %v", got)
		}
		if got := e.Headers["x-replace"]; len(got) != 1 || got[0] != "new" {
			t.Errorf("x-replace: got %v", got)
		}
		if got, ok := e.Headers["x-remove"]; ok {
			t.Errorf("x-remove: got %v, want it removed", got)
		}
	})

	t.Run("clock moves", func(t *testing.T) {
		clk.Advance(1500 * time.Millisecond)
		if got := test(t, srv, "time").header.Get("X-Result"); got != "1700000001500000123" {
			t.Errorf("time after Advance: got %s", got)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		r := test(t, srv, "metrics")
		// increment counter by -1: BAD_ARGUMENT; get counter: OK and value;
		// get histogram: BAD_ARGUMENT; increment unknown counter: BAD_ARGUMENT.
		parts := strings.Split(r.header.Get("X-Result"), ",")
		if len(parts) != 5 || parts[0] != "2" || parts[1] != "0" || parts[3] != "2" || parts[4] != "2" {
			t.Fatalf("x-result %q, want 2,0,<n>,2,2", r.header.Get("X-Result"))
		}
		reqs, _ := h.Metric("test.requests")
		if n, _ := strconv.ParseUint(parts[2], 10, 64); n != reqs {
			t.Errorf("proxy_get_metric saw %d, host has %d", n, reqs)
		}
		if v, ok := h.Metric("test.gauge"); !ok || v != 3 {
			t.Errorf("test.gauge = %d, %v; want 3", v, ok)
		}
		var hist wasmhost.Metric
		for _, m := range h.Metrics() {
			if m.Name == "test.hist" {
				hist = m
			}
		}
		if hist.Value != 2 || hist.Sum != 12 || hist.Type != wasmhost.MetricHistogram {
			t.Errorf("test.hist = %+v, want count 2 sum 12", hist)
		}
		logged, _ := h.Metric("test.logged")
		if logged != reqs {
			t.Errorf("test.logged = %d, test.requests = %d; want equal (every stream logged)", logged, reqs)
		}
	})
}

func TestGuestKongProperties(t *testing.T) {
	_, srv := newGuestHost(t, wasmhost.Options{Kong: true, Workers: 2})
	result := test(t, srv, "props").header.Get("X-Result")
	for _, want := range []string{"source.address=127.0.0.1/0"} {
		if !strings.Contains(result, want) {
			t.Errorf("x-result %q lacks %q", result, want)
		}
	}
	if strings.Contains(result, "source.address=127.0.0.1:") {
		t.Errorf("x-result %q: Kong's source.address has no port", result)
	}
	for _, part := range strings.Split(result, ",") {
		if v, ok := strings.CutPrefix(part, "source.port="); ok {
			if _, err := strconv.Atoi(strings.TrimSuffix(v, "/0")); err != nil {
				t.Errorf("Kong source.port %q is not a decimal string", v)
			}
		}
	}
}

func TestGuestSharedData(t *testing.T) {
	t.Run("hammer", func(t *testing.T) {
		h, srv := newGuestHost(t, wasmhost.Options{Workers: 4})
		// Under Envoy's rules a set with cas 0 never fails, so two workers
		// that both find no counter would both create it: the counter
		// exists before the hammer starts, and every set carries a cas.
		if st := h.Store().Set("counter", []byte("0"), 0); st != wasmhost.StatusOK {
			t.Fatal(st)
		}
		const clients, each = 8, 50
		var wg sync.WaitGroup
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					if r := test(t, srv, "shared"); r.status != 200 {
						t.Errorf("status %d", r.status)
						return
					}
				}
			}()
		}
		wg.Wait()
		v, cas, st := h.Store().Get("counter")
		if st != wasmhost.StatusOK || string(v) != strconv.Itoa(clients*each) {
			t.Fatalf("counter = %q (cas %d, status %d), want %d: lost updates", v, cas, st, clients*each)
		}
	})
	t.Run("cas storm", func(t *testing.T) {
		var sets atomic.Int64
		_, srv := newGuestHost(t, wasmhost.Options{Workers: 2, Store: wasmhost.CASStorm(wasmhost.NewSharedData(false), &sets)})
		got := test(t, srv, "shared").header.Get("X-Result")
		if want := strings.TrimSuffix(strings.Repeat("set=8,", 10), ","); got != want {
			t.Errorf("x-result %q, want %q", got, want)
		}
		if sets.Load() != 10 {
			t.Errorf("%d sets, want 10", sets.Load())
		}
	})
	t.Run("store failure", func(t *testing.T) {
		h, srv := newGuestHost(t, wasmhost.Options{Workers: 2, Store: wasmhost.FailingData(wasmhost.NewSharedData(false), wasmhost.StatusInternalFailure, wasmhost.StatusOK)})
		if got := test(t, srv, "shared").header.Get("X-Result"); got != "get=10" { // INTERNAL_FAILURE
			t.Errorf("x-result %q, want get=10", got)
		}
		if h.Store().(*wasmhost.FaultData).SharedData.(*wasmhost.MemData).Len() != 0 {
			t.Errorf("store was written")
		}
	})
	t.Run("null value", func(t *testing.T) {
		tests := []struct {
			kong     bool
			expected string // status of set(key, NULL, 0, cas)
		}{
			{kong: false, expected: "0"}, // Envoy stores an empty value
			{kong: true, expected: "0"},  // Kong deletes the key
		}
		for _, tc := range tests {
			h, srv := newGuestHost(t, wasmhost.Options{Kong: tc.kong, Workers: 2})
			if got := test(t, srv, "delete").header.Get("X-Result"); got != tc.expected {
				t.Errorf("kong=%v: x-result %q, want %q", tc.kong, got, tc.expected)
			}
			v, _, st := h.Store().Get("doomed")
			if !tc.kong && (st != wasmhost.StatusOK || len(v) != 0) {
				t.Errorf("envoy: doomed = %q, status %d; want an empty value", v, st)
			}
			if tc.kong && st != wasmhost.StatusNotFound {
				t.Errorf("kong: doomed = %q, status %d; want NOT_FOUND (deleted)", v, st)
			}
		}
	})
	t.Run("kong", func(t *testing.T) {
		h, srv := newGuestHost(t, wasmhost.Options{Kong: true, Workers: 2})
		for i := 1; i <= 3; i++ {
			if got := test(t, srv, "shared").header.Get("X-Result"); got != "counter="+strconv.Itoa(i) {
				t.Errorf("request %d: x-result %q", i, got)
			}
		}
		if md := h.Store().(*wasmhost.MemData); !md.Kong() {
			t.Errorf("default Kong store has Envoy semantics")
		}
	})
}

func TestGuestLogsAndTicks(t *testing.T) {
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 2, PluginConfig: []byte("tick"), DisableTicks: true, MinLogLevel: wasmhost.LogInfo})
	test(t, srv, "log-error")
	var found bool
	for _, e := range h.Logs() {
		if e.Message == "an error from the filter" && e.Level == wasmhost.LogError && !e.Host && e.Context != 0 {
			found = true
		}
	}
	if !found {
		t.Errorf("filter error not in Logs(): %v", h.Logs())
	}
	if got := h.TickPeriod(0); got != time.Second {
		t.Errorf("tick period %v, want 1s", got)
	}
	if err := h.Tick(); err != nil {
		t.Fatal(err)
	}
	if v, _ := h.Metric("test.gauge"); v != 2 {
		t.Errorf("test.gauge after one Tick on 2 workers = %d, want 2", v)
	}
}

func TestGuestTrapRestartsWorker(t *testing.T) {
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 1})
	// Every request below runs on the only worker; "sleep" makes the Go
	// runtime call poll_oneoff, which answers ENOSYS as Envoy does.
	r := test(t, srv, "sleep")
	if r.status != 503 {
		t.Fatalf("sleep: status %d, want 503 (body %q)", r.status, r.body)
	}
	if r := test(t, srv, "none"); r.status != 200 {
		t.Fatalf("after restart: status %d, want 200", r.status)
	}
	var sawPoll, sawRestart bool
	for _, e := range h.Logs() {
		sawPoll = sawPoll || strings.Contains(e.Message, "poll_oneoff")
		sawRestart = sawRestart || strings.Contains(e.Message, "restarting worker 0")
	}
	if !sawPoll || !sawRestart {
		t.Errorf("logs lack the poll_oneoff (%v) or restart (%v) line: %v", sawPoll, sawRestart, h.Logs())
	}

	_, srv2 := newGuestHost(t, wasmhost.Options{Workers: 1, AllowPollOneoff: true})
	if r := test(t, srv2, "sleep"); r.status != 200 {
		t.Errorf("sleep with AllowPollOneoff: status %d, want 200", r.status)
	}
}
