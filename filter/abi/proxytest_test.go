package abi_test

// These tests run the module, built from this tree, in wazero through the
// tetratelabs SDK's proxytest host emulator: an independent implementation
// of the host side of the ABI, so they check that the module speaks
// proxy-wasm 0.2.1 correctly, not just that it agrees with our own host.

import (
	"encoding/base64"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

// loadModule returns the module built from this tree (internal/testsupport/wasmbuild),
// so a stale build/tokengate.wasm cannot pass; the test fails without it.
func loadModule(t *testing.T) []byte {
	t.Helper()
	b, err := wasmbuild.Module()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// start runs the module in the emulator with a plugin configuration and
// returns the emulator and whether the plugin started.
func start(t *testing.T, config string, props map[string]string) (proxytest.HostEmulator, bool) {
	t.Helper()
	wasm, err := reactorAsCommand(loadModule(t))
	if err != nil {
		t.Fatal(err)
	}
	vm, err := proxytest.NewWasmVMContext(wasm)
	if err != nil {
		t.Fatalf("NewWasmVMContext: %v", err)
	}
	t.Cleanup(func() { vm.Close() })
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(config))
	for k, v := range props {
		opt = opt.WithProperty(strings.Split(k, "."), []byte(v))
	}
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(reset)
	if host.StartVM() != types.OnVMStartStatusOK {
		t.Fatal("proxy_on_vm_start returned false")
	}
	return host, host.StartPlugin() == types.OnPluginStartStatusOK
}

type reply struct {
	status  uint32 // 200 when no local reply was sent
	headers map[string]string
	grpc    int32
	body    string
}

// do sends one request through the module: request headers, then response
// headers unless a local reply was sent.
func do(t *testing.T, host proxytest.HostEmulator, headers ...string) reply {
	t.Helper()
	hs := [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "example.com"}}
	for i := 0; i+1 < len(headers); i += 2 {
		hs = append(hs, [2]string{headers[i], headers[i+1]})
	}
	id := host.InitializeHttpContext()
	act := host.CallOnRequestHeaders(id, hs, true)
	if lr := host.GetSentLocalResponse(id); lr != nil {
		if act != types.ActionPause {
			t.Errorf("local reply sent but the action was %v, want Pause", act)
		}
		r := reply{status: lr.StatusCode, headers: map[string]string{}, grpc: lr.GRPCStatus, body: string(lr.Data)}
		for _, kv := range lr.Headers {
			r.headers[kv[0]] = kv[1]
		}
		host.CompleteHttpContext(id)
		return r
	}
	if act != types.ActionContinue {
		t.Fatalf("request headers: got action %v, want Continue", act)
	}
	host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
	r := reply{status: 200, headers: map[string]string{}}
	for _, kv := range host.GetCurrentResponseHeaders(id) {
		if !strings.HasPrefix(kv[0], ":") {
			r.headers[kv[0]] = kv[1]
		}
	}
	host.CompleteHttpContext(id)
	return r
}

func setIP(t *testing.T, host proxytest.HostEmulator, addr string) {
	t.Helper()
	if err := host.SetProperty([]string{"source", "address"}, []byte(addr)); err != nil {
		t.Fatal(err)
	}
}

var storedFormat = regexp.MustCompile(`^[0-9]+\.[0-9]{6}:[0-9]{10}\.[0-9]{6}:192\.0\.2\.7$`)

// emulatorStore reads the emulator's shared data, for sharedstate.Lookup.
type emulatorStore struct{}

func (emulatorStore) Get(key string) ([]byte, uint32, error) {
	v, cas, err := proxywasm.GetSharedData(key)
	if errors.Is(err, types.ErrorStatusNotFound) {
		return nil, 0, sharedstate.ErrNotFound
	}
	return v, cas, err
}

func (emulatorStore) Set(key string, value []byte, cas uint32) error {
	return proxywasm.SetSharedData(key, value, cas)
}

const perIP = `{"name":"global-rps","limit_keys":["ip:address"],"algorithm":"token_bucket","algorithm_config":{"rps":5,"burst":10}}`

// wazero's default clock, which proxytest uses, starts at 2022-01-01 and
// moves 1 ms per read: the module reads it once per decision, so 11
// requests see 55 ms pass, 0.275 tokens at 5/s.
func TestWasmBurstThen429(t *testing.T) {
	host, ok := start(t, perIP, nil)
	if !ok {
		t.Fatalf("plugin refused its configuration: %q", host.GetErrorLogs())
	}
	setIP(t, host, "192.0.2.7:41000")
	for i := 0; i < 10; i++ {
		r := do(t, host)
		if r.status != 200 {
			t.Fatalf("request %d: got %d, want 200", i, r.status)
		}
		want := map[string]string{
			"ratelimit-limit":     "10",
			"ratelimit-remaining": []string{"9", "8", "7", "6", "5", "4", "3", "2", "1", "0"}[i],
			"ratelimit-reset":     map[bool]string{true: "1", false: "2"}[i < 5],
			"ratelimit-policy":    `"global-rps";q=10;w=2`,
		}
		want["ratelimit"] = `"global-rps";r=` + want["ratelimit-remaining"] + ";t=" + want["ratelimit-reset"]
		for k, v := range want {
			if r.headers[k] != v {
				t.Errorf("request %d: %s got %q, want %q", i, k, r.headers[k], v)
			}
		}
	}
	r := do(t, host)
	want := map[string]string{
		"retry-after":         "1",
		"ratelimit-limit":     "10",
		"ratelimit-remaining": "0",
		"ratelimit-reset":     "1", // this request could pass in 1 s, not when the bucket is full
		"ratelimit":           `"global-rps";r=0;t=1`,
		"ratelimit-policy":    `"global-rps";q=10;w=2`,
		"x-tokengate-reason":  "token_bucket_exceeded",
		"x-tokengate-rule":    "global-rps",
		"content-type":        "application/json",
	}
	if r.status != 429 {
		t.Fatalf("11th request: got %d, want 429", r.status)
	}
	for k, v := range want {
		if r.headers[k] != v {
			t.Errorf("429: %s got %q, want %q", k, r.headers[k], v)
		}
	}
	if len(r.headers) != len(want) {
		t.Errorf("429 headers: got %v, want exactly %v", r.headers, want)
	}
	if r.grpc != -1 {
		t.Errorf("grpc status: got %d, want -1 (not gRPC)", r.grpc)
	}
	if got, want := r.body, `{"error":"rate_limited","reason":"token_bucket_exceeded","rule":"global-rps","retry_after":1}`+"\n"; got != want {
		t.Errorf("body: got %q, want %q", got, want)
	}
	if n, err := host.GetCounterMetric("tokengate.rule.global-rps.allowed"); err != nil || n != 10 {
		t.Errorf("allowed counter: got %d (%v), want 10", n, err)
	}
	if n, err := host.GetCounterMetric("tokengate.rule.global-rps.rejected"); err != nil || n != 1 {
		t.Errorf("rejected counter: got %d (%v), want 1", n, err)
	}

	// The stored value: "{tokens}:{last_refill}", 6 decimals each, under
	// tb:{rule}:{key}. Ten requests took 10 tokens while the clock moved
	// about 9 ms, which refilled about 0.045 tokens.
	key, v, err := sharedstatetest.Lookup(emulatorStore{}, false, "global-rps", "192.0.2.7", config.DefaultMaxKeys)
	if err != nil {
		t.Fatalf("reading the bucket back: %v", err)
	}
	if !strings.HasPrefix(key, "tb:global-rps:$") {
		t.Errorf("key: got %q, want tb:global-rps:$<slot>", key)
	}
	if !storedFormat.Match(v) {
		t.Fatalf("stored value %q does not match %s", v, storedFormat)
	}
	tokens, _ := strconv.ParseFloat(strings.Split(string(v), ":")[0], 64)
	last, _ := strconv.ParseFloat(strings.Split(string(v), ":")[1], 64)
	if tokens < 0.04 || tokens > 0.05 || last < 1640995200 || last > 1640995201 {
		t.Errorf("stored value: got %q, want about 0.045 tokens at 2022-01-01T00:00:00Z (wazero's clock)", v)
	}
}

func TestWasmIsolationBetweenIPs(t *testing.T) {
	host, ok := start(t, perIP, nil)
	if !ok {
		t.Fatal("plugin refused its configuration")
	}
	setIP(t, host, "192.0.2.1:1")
	for i := 0; i < 10; i++ {
		do(t, host)
	}
	if r := do(t, host); r.status != 429 {
		t.Fatalf("first IP after its burst: got %d, want 429", r.status)
	}
	setIP(t, host, "[2001:db8::5]:443")
	if r := do(t, host); r.status != 200 || r.headers["ratelimit-remaining"] != "9" {
		t.Fatalf("second IP: got %d remaining %q, want 200 and 9", r.status, r.headers["ratelimit-remaining"])
	}
	if _, _, err := sharedstatetest.Lookup(emulatorStore{}, false, "global-rps", "2001:db8::/64", config.DefaultMaxKeys); err != nil { // keyed by its /64 (issue 22)
		t.Errorf("IPv6 bucket: %v", err)
	}
}

func TestWasmVariableCost(t *testing.T) {
	host, ok := start(t, `{"name":"llm","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1,"burst":10,"cost_source":"header:x-tokens","default_cost":2}}`, nil)
	if !ok {
		t.Fatal("plugin refused its configuration")
	}
	steps := []struct {
		cost       string
		wantStatus uint32
		wantLeft   string
	}{
		{"4", 200, "6"},
		{"", 200, "4"},    // absent: default_cost 2
		{"abc", 200, "2"}, // garbage: default_cost 2
		{"2.5", 429, ""},  // 2.0x tokens left
		{"1.5", 200, "0"},
	}
	for i, s := range steps {
		hs := []string{"x-api-key", "key-1"}
		if s.cost != "" {
			hs = append(hs, "x-tokens", s.cost)
		}
		r := do(t, host, hs...)
		if r.status != s.wantStatus || (s.wantStatus == 200 && r.headers["ratelimit-remaining"] != s.wantLeft) {
			t.Errorf("step %d (cost %q): got %d remaining %q, want %d %q", i, s.cost, r.status, r.headers["ratelimit-remaining"], s.wantStatus, s.wantLeft)
		}
	}
}

func bearer(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return "Bearer " + enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(claims)) + ".c2ln"
}

func TestWasmJWTTiers(t *testing.T) {
	host, ok := start(t, `{"rules":[
		{"name":"enterprise","limit_keys":["jwt:sub"],"algorithm_config":{"rps":1000,"burst":2000},"match":{"jwt:plan":"enterprise"}},
		{"name":"free","limit_keys":["jwt:sub"],"algorithm_config":{"rps":1,"burst":2},"match":{"jwt:plan":"free"}}]}`, nil)
	if !ok {
		t.Fatal("plugin refused its configuration")
	}
	free := bearer(`{"sub":"u-1","plan":"free"}`)
	ent := bearer(`{"sub":"org-9","plan":"enterprise"}`)
	for i, want := range []uint32{200, 200, 429} {
		if r := do(t, host, "authorization", free); r.status != want {
			t.Errorf("free request %d: got %d, want %d", i, r.status, want)
		}
	}
	r := do(t, host, "authorization", ent)
	if r.status != 200 || r.headers["ratelimit-limit"] != "2000" || r.headers["ratelimit"] != `"enterprise";r=1999;t=1` {
		t.Errorf("enterprise: got %d %v", r.status, r.headers)
	}
	if _, _, err := sharedstatetest.Lookup(emulatorStore{}, false, "free", "u-1", config.DefaultMaxKeys); err != nil {
		t.Errorf("free bucket keyed by the JWT subject: %v", err)
	}
}

func TestWasmShadowMode(t *testing.T) {
	host, ok := start(t, `{"bundle_version":1,"policies":[{"id":"obs","spec":{"mode":"shadow","rules":[
		{"name":"obs-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":1}}]}}]}`, nil)
	if !ok {
		t.Fatal("plugin refused its configuration")
	}
	setIP(t, host, "198.51.100.3:9")
	for i := 0; i < 3; i++ {
		if r := do(t, host); r.status != 200 || len(r.headers) != 0 {
			t.Fatalf("request %d: got %d headers %v, want 200 and no headers", i, r.status, r.headers)
		}
	}
	if n, err := host.GetCounterMetric("tokengate.rule.obs-ip.shadow_rejected"); err != nil || n != 2 {
		t.Errorf("shadow_rejected: got %d (%v), want 2", n, err)
	}
	if _, _, err := sharedstatetest.Lookup(emulatorStore{}, true, "obs-ip", "198.51.100.3", config.DefaultMaxKeys); err != nil {
		t.Errorf("shadow bucket: %v", err)
	}
}

func TestWasmInvalidConfigRefused(t *testing.T) {
	host, ok := start(t, `{"name":"bad","algorithm_config":{"tokens_per_second":100,"burst":50}}`, nil)
	if ok {
		t.Fatal("the plugin accepted an invalid configuration")
	}
	logs := host.GetErrorLogs()
	want := "tokengate: invalid configuration: algorithm_config.burst: must be >= tokens_per_second (100), got 50"
	if len(logs) != 1 || logs[0] != want {
		t.Errorf("error logs: got %q, want [%q]", logs, want)
	}
}

func TestWasmGRPC(t *testing.T) {
	host, ok := start(t, `{"name":"rpc","algorithm_config":{"rps":1,"burst":1}}`, nil)
	if !ok {
		t.Fatal("plugin refused its configuration")
	}
	do(t, host, "content-type", "application/grpc")
	r := do(t, host, "content-type", "application/grpc")
	if r.status != 429 || r.grpc != 8 {
		t.Errorf("got status %d grpc %d, want 429 with grpc-status 8 (RESOURCE_EXHAUSTED)", r.status, r.grpc)
	}
}
