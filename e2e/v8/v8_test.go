// Package v8 runs the module under V8, Envoy's engine, through a
// proxy-wasm host written in JavaScript (host.mjs) and run by Node with
// --no-liftoff, as Envoy runs V8: the optimizing tier only. The host shares
// no code with the module or with the wazero host; these tests give it the
// same scenarios the wazero end-to-end tests check.
package v8

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

// t0 is the fixed clock: 2023-11-14T22:13:20Z, a whole second.
const t0 = "1700000000000000000"

type step map[string]any

type result struct {
	Op        string      `json:"op"`
	OK        bool        `json:"ok"`
	Error     string      `json:"error"`
	Status    int         `json:"status"`
	Headers   [][2]string `json:"headers"`
	Body      string      `json:"body"`
	Paused    bool        `json:"paused"`
	Continued int         `json:"continued"`
	// Held, ID and Worker describe a request held for a tick; Released
	// are the held requests a tick finished, Periods the workers' tick
	// periods after it and TickSets how often they were set (delay_test.go).
	Held     bool     `json:"held"`
	ID       int      `json:"id"`
	Worker   int      `json:"worker"`
	Released []result `json:"released"`
	Periods  []int    `json:"periods"`
	TickSets int      `json:"tickSets"`
	Calls    []struct {
		Worker  int         `json:"worker"` // a tick's calls: the worker whose tick made it
		Cluster string      `json:"cluster"`
		Headers [][2]string `json:"headers"`
		Timeout int         `json:"timeout"`
		Body    []byte      `json:"body"`
	} `json:"calls"`
	Statuses map[string]int `json:"statuses"`
	// During is the request run inside this one's shared-data get (a
	// compare-and-swap race); Trace the callbacks a request got, in order.
	During *result  `json:"during"`
	Trace  []string `json:"trace"`
	// Module and Host are an imports step's lists, "module.name".
	Module  []string `json:"module"`
	Host    []string `json:"host"`
	Entries []struct {
		Key, Value string
		CAS        uint32
	} `json:"entries"`
	Value string `json:"value"`
	Logs  []struct {
		Level int
		Msg   string
	} `json:"logs"`
}

func (r result) header(name string) string {
	for _, h := range r.Headers {
		if h[0] == name {
			return h[1]
		}
	}
	return ""
}

// scripts are the JavaScript files the tests run. Node reads them, not
// this process, so go test's cache would not see them change: node reads
// them here too, which makes their contents part of the cache key.
var scripts = []string{"host.mjs", "run.mjs", "../../bench/v8/bench.mjs", "../../bench/v8/ab.mjs", "../../bench/v8/cases.mjs", "../../bench/v8/nop.mjs", "../../bench/v8/configs.mjs"}

// node returns the path of node, or skips: .ci/run installs it.
func node(t *testing.T) string {
	t.Helper()
	for _, f := range scripts {
		if _, err := os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	p, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("TOKENGATE_REQUIRE_V8") != "" {
			t.Fatal("node is not installed, and TOKENGATE_REQUIRE_V8 is set (.ci/run sets it after installing nodejs)")
		}
		t.Skip("node is not installed (.ci/run installs it): the V8 tests need Node's V8")
	}
	return p
}

// run runs a script under V8 and returns one result per step, the start
// first.
func run(t *testing.T, cfg string, workers int, clusters []string, steps ...step) []result {
	t.Helper()
	n := node(t)
	wasm, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	script := map[string]any{"wasm": wasm, "pluginConfig": cfg, "workers": workers, "nowNs": t0, "clusters": clusters, "steps": steps}
	b, _ := json.Marshal(script)
	f := filepath.Join(t.TempDir(), "script.json")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(n, "--no-liftoff", "run.mjs", f)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var res []result
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%v: %s", err, sc.Bytes())
		}
		res = append(res, r)
	}
	if len(res) == 0 || res[0].Op != "start" {
		t.Fatalf("no start line: %s", out)
	}
	return res
}

func get(path, source string, extra ...string) step {
	hs := [][2]string{{":path", path}, {":method", "GET"}, {":authority", "example.com"}, {":scheme", "http"}}
	for i := 0; i+1 < len(extra); i += 2 {
		hs = append(hs, [2]string{extra[i], extra[i+1]})
	}
	return step{"op": "request", "headers": hs, "source": source}
}

func advance(ms int) step         { return step{"op": "advance", "ms": ms} }
func repeat(n int, s step) step   { return step{"op": "repeat", "n": n, "step": s} }
func metric(name string) step     { return step{"op": "metric", "name": name} }
func shared() step                { return step{"op": "shared"} }
func onWorker(w int, s step) step { s["worker"] = w; return s }
func withRLS(s step, v any) step  { s["rls"] = v; return s }
func mustStart(t *testing.T, r []result) {
	t.Helper()
	if !r[0].OK {
		t.Fatalf("start: %s %v", r[0].Error, r[0].Logs)
	}
}

const perIP = `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":5,"burst":10}}`

// TestBurstThen429 checks the burst, then a 429 with every header, a
// refill on the clock, and a second client with its own bucket.
func TestBurstThen429(t *testing.T) {
	a, b := "192.0.2.1:4000", "192.0.2.2:4000"
	r := run(t, perIP, 2, nil,
		repeat(10, get("/", a)), get("/", a), get("/", b), advance(400), get("/", a), get("/", a), get("/", a))
	mustStart(t, r)
	if s := r[1].Statuses; s["200"] != 10 || len(s) != 1 {
		t.Errorf("burst: %v, want 10 × 200", s)
	}
	rej := r[2]
	want := map[string]string{"retry-after": "1", "ratelimit-limit": "10", "ratelimit-remaining": "0", "ratelimit-reset": "1",
		"ratelimit": `"per-ip";r=0;t=1`, "ratelimit-policy": `"per-ip";q=10;w=2`,
		"x-tokengate-rule": "per-ip", "x-tokengate-reason": "token_bucket_exceeded", "content-type": "application/json"}
	if rej.Status != 429 {
		t.Fatalf("11th request: %d", rej.Status)
	}
	for k, v := range want {
		if got := rej.header(k); got != v {
			t.Errorf("429 %s = %q, want %q", k, got, v)
		}
	}
	if !strings.Contains(rej.Body, `"error":"rate_limited"`) {
		t.Errorf("429 body %q", rej.Body)
	}
	if r[3].Status != 200 || r[3].header("ratelimit-remaining") != "9" {
		t.Errorf("client b: %d remaining %q, want its own bucket", r[3].Status, r[3].header("ratelimit-remaining"))
	}
	// 0.4 s at 5/s: two tokens.
	if r[5].Status != 200 || r[6].Status != 200 || r[7].Status != 429 {
		t.Errorf("after 0.4 s: %d %d %d, want 200 200 429", r[5].Status, r[6].Status, r[7].Status)
	}
}

// TestUpstreamRateLimitLines: an upstream that sends its own RateLimit and
// RateLimit-Policy keeps them, and the filter's follow as lines of their
// own (proxy_add_header_map_value: the lines of a list field are one list);
// the legacy RateLimit-Remaining, which is not a list, is replaced.
func TestUpstreamRateLimitLines(t *testing.T) {
	req := get("/", "192.0.2.1:4000")
	req["response"] = map[string]any{"status": 200, "headers": [][2]string{
		{"ratelimit", `"api";r=41;t=30`}, {"ratelimit-policy", `"api";q=50;w=60`}, {"ratelimit-remaining", "41"}}}
	r := run(t, perIP, 1, nil, req)
	mustStart(t, r)
	lines := func(name string) []string {
		var vs []string
		for _, h := range r[1].Headers {
			if h[0] == name {
				vs = append(vs, h[1])
			}
		}
		return vs
	}
	for name, want := range map[string][]string{
		"ratelimit":           {`"api";r=41;t=30`, `"per-ip";r=9;t=1`},
		"ratelimit-policy":    {`"api";q=50;w=60`, `"per-ip";q=10;w=2`},
		"ratelimit-remaining": {"9"},
	} {
		if got := lines(name); !slices.Equal(got, want) {
			t.Errorf("%s lines %q, want %q", name, got, want)
		}
	}
}

// TestWorkersShareBuckets: four VMs, one store with Envoy's CAS rules;
// requests spread over them take exactly the burst together, and the
// stored value has the documented format.
func TestWorkersShareBuckets(t *testing.T) {
	var steps []step
	for i := range 16 {
		steps = append(steps, onWorker(i%4, get("/", "192.0.2.1:4000")))
	}
	steps = append(steps, shared(), metric("tokengate.rule.per-ip.allowed"))
	r := run(t, perIP, 4, nil, steps...)
	mustStart(t, r)
	ok := 0
	for _, x := range r[1:17] {
		if x.Status == 200 {
			ok++
		}
	}
	if ok != 10 {
		t.Errorf("admitted %d over 4 workers, want the burst, 10", ok)
	}
	var bucket string
	for _, e := range r[17].Entries {
		if strings.HasPrefix(e.Key, "tb:per-ip:") {
			bucket = e.Value
		}
	}
	if !regexp.MustCompile(`^0\.000000:1700000000\.000000:192\.0\.2\.1$`).MatchString(bucket) {
		t.Errorf("stored bucket %q, want tokens:last_refill:owner", bucket)
	}
	if r[18].Value != "10" {
		t.Errorf("allowed counter %q (i64 through BigInt), want 10", r[18].Value)
	}
}

// TestVariableCostTiersShadow: costs from a header, tiers chosen by a
// header match, and a shadow rule that counts without rejecting.
func TestVariableCostTiersShadow(t *testing.T) {
	const cfg = `{"bundle_version":1,"policies":[
	  {"id":"api","spec":{"rules":[
	    {"name":"gold","limit_keys":["header:x-api-key"],"match":{"header:x-plan":"gold"},"algorithm_config":{"rps":1,"burst":20,"cost_source":"header:x-cost"}},
	    {"name":"free","limit_keys":["header:x-api-key"],"match":{"header:x-plan":"free"},"algorithm_config":{"rps":1,"burst":2}}]}},
	  {"id":"trial","spec":{"mode":"shadow","rules":[{"name":"strict","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1,"burst":1}}]}}]}`
	src := "192.0.2.1:1"
	r := run(t, cfg, 2, nil,
		get("/", src, "x-api-key", "k1", "x-plan", "gold", "x-cost", "7.5"),
		get("/", src, "x-api-key", "k1", "x-plan", "gold", "x-cost", "13"),
		get("/", src, "x-api-key", "k1", "x-plan", "gold", "x-cost", "1"),
		repeat(3, get("/", src, "x-api-key", "k2", "x-plan", "free")),
		metric("tokengate.rule.strict.shadow_rejected"), metric("tokengate.rule.strict.rejected"))
	mustStart(t, r)
	if r[1].Status != 200 || r[1].header("ratelimit-remaining") != "12" {
		t.Errorf("cost 7.5 of 20: %d remaining %q, want 12 whole tokens", r[1].Status, r[1].header("ratelimit-remaining"))
	}
	if r[2].Status != 429 || r[3].Status != 200 {
		t.Errorf("cost 13 with 12.5 left: %d then cost 1: %d; want 429 then 200", r[2].Status, r[3].Status)
	}
	if s := r[4].Statuses; s["200"] != 2 || s["429"] != 1 {
		t.Errorf("free tier: %v, want 2 × 200, 1 × 429", s)
	}
	// The shadow rule (burst 1 per key, no refill on the fixed clock)
	// would have rejected k1's second and third and k2's second and third.
	if r[5].Value != "4" || r[6].Value != "0" {
		t.Errorf("shadow rule: shadow_rejected %s, rejected %s; want 4 and 0", r[5].Value, r[6].Value)
	}
}

// TestGRPCAndInvalidConfig: a gRPC request gets RESOURCE_EXHAUSTED as a
// gRPC status; a configuration the filter refuses fails the start with its
// path-named message.
func TestGRPCAndInvalidConfig(t *testing.T) {
	const cfg = `{"name":"one","algorithm_config":{"rps":1,"burst":1}}`
	r := run(t, cfg, 1, nil, get("/svc/M", "192.0.2.1:1", "content-type", "application/grpc"),
		get("/svc/M", "192.0.2.1:1", "content-type", "Application/GRPC+proto"))
	mustStart(t, r)
	if r[1].Status != 200 || r[1].header("grpc-status") != "" || r[1].header("ratelimit-remaining") != "0" {
		t.Errorf("first gRPC request: %d %v, want the upstream's 200 with the RateLimit headers", r[1].Status, r[1].Headers)
	}
	// Envoy's gRPC local reply: HTTP 200, grpc-status RESOURCE_EXHAUSTED,
	// the details percent-encoded into grpc-message.
	if r[2].Status != 200 || r[2].header("grpc-status") != "8" || r[2].header("content-type") != "application/grpc" ||
		r[2].header("grpc-message") != "tokengate%3A%20tokengate_rate_limited" || r[2].Body != "" {
		t.Errorf("gRPC rejection: %d %v body %q", r[2].Status, r[2].Headers, r[2].Body)
	}
	bad := run(t, `{"name":"x","algorithm_config":{"rps":2,"burst":1}}`, 1, nil)
	if bad[0].OK || !strings.Contains(bad[0].Error, "proxy_on_configure returned false") ||
		len(bad[0].Logs) == 0 || !strings.Contains(bad[0].Logs[0].Msg, "algorithm_config.burst: must be >= rps (2), got 1") {
		t.Errorf("invalid configuration: %+v", bad[0])
	}
}

// TestClusterScopeUnderV8 pauses requests for the rate-limit service and
// resumes them from the root context (set_effective_context, then
// continue_stream), as Envoy does: admitted, rejected (the local bucket
// refunded), and a failed call with on_error allow.
func TestClusterScopeUnderV8(t *testing.T) {
	const cfg = `{"rules":[
	  {"name":"local","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":5}},
	  {"name":"global","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":5}}],
	  "settings":{"rls":{"cluster":"rls","timeout_ms":30}}}`
	src := "192.0.2.1:1"
	r := run(t, cfg, 2, []string{"rls"},
		withRLS(get("/", src), map[string]any{"codes": []int{1}, "remaining": 4}),
		withRLS(get("/", src), map[string]any{"codes": []int{2}, "reset": 3}),
		withRLS(get("/", src), map[string]any{"fail": true}),
		shared(), metric("tokengate.rls_errors"))
	mustStart(t, r)
	ok, over, failed := r[1], r[2], r[3]
	if !ok.Paused || ok.Continued != 1 || ok.Status != 200 || len(ok.Calls) != 1 {
		t.Errorf("admitted: paused %v continued %d status %d calls %d", ok.Paused, ok.Continued, ok.Status, len(ok.Calls))
	} else if c := ok.Calls[0]; c.Cluster != "rls" || c.Timeout != 30 {
		t.Errorf("call %+v", c)
	} else {
		d := oneDescriptor(t, c.Body)
		wantEntries(t, "cluster call", d, map[string]string{"tokengate_rule": "global", "key": "192.0.2.1"})
		if d.hits != 1 {
			t.Errorf("cluster call: hits_addend %d, want 1", d.hits)
		}
	}
	// Retry-After: the service's 3 s plus a jitter of 0 to half of it
	// chosen by the client's identity (filter/reply.go), the same in the
	// body.
	ra, err := strconv.Atoi(over.header("retry-after"))
	if over.Status != 429 || over.Continued != 0 || over.header("x-tokengate-rule") != "global" || err != nil || ra < 3 || ra > 4 ||
		!strings.Contains(over.Body, `"retry_after":`+strconv.Itoa(ra)+"}") {
		t.Errorf("rejected: %d continued %d %v %q", over.Status, over.Continued, over.Headers, over.Body)
	}
	if failed.Status != 200 || failed.Continued != 1 {
		t.Errorf("failed call, on_error allow: %d continued %d", failed.Status, failed.Continued)
	}
	// Three requests reached the local bucket; the rejected one was
	// refunded: 5 - 2 = 3.
	var local []string
	for _, e := range r[4].Entries {
		if strings.HasPrefix(e.Key, "tb:local:") {
			local = append(local, e.Value)
		}
	}
	if len(local) != 1 || !strings.HasPrefix(local[0], "3.000000:") {
		t.Errorf("local buckets %q, want one with 3 tokens", local)
	}
	if r[5].Value != "1" {
		t.Errorf("rls_errors %s, want 1", r[5].Value)
	}
}

// TestMemoryGrowsInsideHostCalls hands the module header values of 4 MiB:
// its malloc grows linear memory inside proxy_get_header_map_value, which
// in V8 detaches every view of the old buffer; a host that wrote through a
// stale view would lose the value (or crash). The per-key rule must still
// see each key and keep separate buckets.
func TestMemoryGrowsInsideHostCalls(t *testing.T) {
	const cfg = `{"name":"per-key","limit_keys":["header:x-key"],"algorithm_config":{"rps":1,"burst":2}}`
	big := func(c string) string { return strings.Repeat(c, 4<<20) }
	r := run(t, cfg, 1, nil,
		get("/", "192.0.2.1:1", "x-key", big("a")), get("/", "192.0.2.1:1", "x-key", big("a")),
		get("/", "192.0.2.1:1", "x-key", big("a")), get("/", "192.0.2.1:1", "x-key", big("b")))
	mustStart(t, r)
	got := []int{r[1].Status, r[2].Status, r[3].Status, r[4].Status}
	if got[0] != 200 || got[1] != 200 || got[2] != 429 || got[3] != 200 {
		t.Errorf("statuses %v, want 200 200 429 200", got)
	}
}

// TestBenchScript runs `make bench`'s V8 benchmark (bench/v8/bench.mjs)
// briefly: every case answers as it should (the script checks each status)
// and reports its figures.
func TestBenchScript(t *testing.T) {
	n := node(t)
	wasm, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(n, "--no-liftoff", "../../bench/v8/bench.mjs", wasm, "50", "2").Output()
	if err != nil {
		t.Fatalf("bench.mjs: %v %s", err, out)
	}
	var res struct {
		Rounds int `json:"rounds"`
		Cases  map[string]struct {
			NsPerReq  float64   `json:"nsPerReq"`
			Samples   []float64 `json:"samples"`
			HostCalls float64   `json:"hostCalls"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, name := range []string{"o-no-filter", "a-passthrough", "b-one-rule", "c-four-rules", "d-rejected", "e-100000-ips"} {
		if c, ok := res.Cases[name]; !ok || !(c.NsPerReq > 0) || len(c.Samples) != 2 {
			t.Errorf("case %s: %+v, want a median of two rounds", name, c)
		}
	}
	// Host calls a request: none for the module that does nothing, :path
	// for the passthrough, and those BENCHMARKS.md lists for one rule (on
	// the real clock, a second boundary may add the slot seed's read).
	if o, a, b := res.Cases["o-no-filter"].HostCalls, res.Cases["a-passthrough"].HostCalls, res.Cases["b-one-rule"].HostCalls; o != 0 || a != 1 || b < 9 || b > 9.1 {
		t.Errorf("host calls per request: no filter %v, passthrough %v, one rule %v; want 0, 1, 9", o, a, b)
	}
}

// TestBenchABScript runs bench/v8/ab.mjs, the side-by-side comparison of
// builds, briefly with the same build twice: every case answers as it
// should (the script checks each status) and gets a row.
func TestBenchABScript(t *testing.T) {
	n := node(t)
	wasm, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(n, "--no-liftoff", "../../bench/v8/ab.mjs", "2", "20", "x=../..:"+wasm, "y=../..:"+wasm).CombinedOutput()
	if err != nil {
		t.Fatalf("ab.mjs: %v %s", err, out)
	}
	for _, name := range []string{"o-no-filter", "a-passthrough", "b-one-rule", "c-four-rules", "d-rejected", "e-100000-ips", "x: one rule", "y: one rule"} {
		if !bytes.Contains(out, []byte(name)) {
			t.Errorf("no %q in the output:\n%s", name, out)
		}
	}
}

// TestBenchConfigsScript runs bench/v8/configs.mjs, the side-by-side
// comparison of configurations, briefly: every variant gets a row (the
// script fails unless each request is admitted).
func TestBenchConfigsScript(t *testing.T) {
	n := node(t)
	wasm, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	noHeaders := wasm + `@{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}`
	out, err := exec.Command(n, "--no-liftoff", "../../bench/v8/configs.mjs", "2", "20", "pass="+wasm+"@a-passthrough", "nop=nop@",
		"one="+wasm+"@b-one-rule", "json="+noHeaders).CombinedOutput()
	if err != nil {
		t.Fatalf("configs.mjs: %v %s", err, out)
	}
	for _, name := range []string{"pass ", "nop ", "one ", "json "} {
		if !bytes.Contains(out, []byte("\n"+name)) {
			t.Errorf("no row %q in the output:\n%s", name, out)
		}
	}
}

// TestCASRaceUnderV8: worker 1 takes a token from the bucket between
// worker 0's proxy_get_shared_data and its proxy_set_shared_data. Under
// Envoy's rules worker 0's set fails (CAS_MISMATCH) and it retries from the
// new value: the burst of 2 is exact and the retry is counted. A host that
// ignored the cas would let worker 0 write over worker 1's take, and the
// third request would pass.
func TestCASRaceUnderV8(t *testing.T) {
	const cfg = `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":2}}`
	a := func(w int) step { return onWorker(w, get("/", "192.0.2.1:1")) }
	first := a(0)
	first["during"] = a(1)
	r := run(t, cfg, 2, nil, first, a(0), a(1), shared(), metric("tokengate.rule.per-ip.cas_retries"))
	mustStart(t, r)
	in := r[1].During
	if in == nil || in.Status != 200 || in.Worker != 1 || in.header("ratelimit-remaining") != "1" {
		t.Fatalf("the request inside the get: %+v, want worker 1 admitted with 1 left", in)
	}
	if r[1].Status != 200 || r[1].header("ratelimit-remaining") != "0" {
		t.Errorf("the raced request: %d remaining %q, want 200 with 0 left (retried from worker 1's value)", r[1].Status, r[1].header("ratelimit-remaining"))
	}
	if r[2].Status != 429 || r[3].Status != 429 {
		t.Errorf("third and fourth: %d %d, want 429 429 (a burst of 2)", r[2].Status, r[3].Status)
	}
	var bucket []string
	for _, e := range r[4].Entries {
		if strings.HasPrefix(e.Key, "tb:per-ip:") {
			bucket = append(bucket, e.Value)
		}
	}
	if len(bucket) != 1 || !strings.HasPrefix(bucket[0], "0.000000:") {
		t.Errorf("bucket %q, want one with 0 tokens", bucket)
	}
	if r[5].Value != "1" {
		t.Errorf("cas_retries %s, want 1", r[5].Value)
	}
}

// TestLocalReplyResponseCallbacks: a local reply goes through the response
// callbacks, as in Envoy (the reply is encoded through the filter chain):
// proxy_on_response_headers, and proxy_on_response_body for its body; the
// filter leaves it as it sent it (each header once). A gRPC reply has no
// body: end of stream on the headers.
func TestLocalReplyResponseCallbacks(t *testing.T) {
	const cfg = `{"name":"one","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":1}}`
	r := run(t, cfg, 1, nil, step{"op": "trace", "on": true}, get("/", "192.0.2.1:1"), get("/", "192.0.2.1:1"),
		get("/", "192.0.2.1:1", "content-type", "application/grpc"))
	mustStart(t, r)
	base := []string{"proxy_on_context_create", "proxy_on_request_headers", "proxy_on_response_headers"}
	end := []string{"proxy_on_log", "proxy_on_done", "proxy_on_delete"}
	want := [][]string{
		append(slices.Clone(base), end...),
		append(append(slices.Clone(base), "proxy_on_response_body"), end...),
		append(slices.Clone(base), end...),
	}
	for i, x := range r[2:5] {
		if !slices.Equal(x.Trace, want[i]) {
			t.Errorf("request %d (%d): callbacks %v, want %v", i+1, x.Status, x.Trace, want[i])
		}
	}
	rej := r[3]
	if rej.Status != 429 {
		t.Fatalf("second request: %d", rej.Status)
	}
	seen := map[string]int{}
	for _, h := range rej.Headers {
		seen[h[0]]++
	}
	for _, name := range []string{"retry-after", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "ratelimit", "ratelimit-policy",
		"x-tokengate-rule", "x-tokengate-reason", "content-type"} {
		if seen[name] != 1 {
			t.Errorf("429 header %s %d times, want once: %v", name, seen[name], rej.Headers)
		}
	}
	if len(seen) != 9 {
		t.Errorf("429 headers %v, want the nine the reply sets", rej.Headers)
	}
}

// TestHostProvidesTheImports: the V8 host provides exactly the functions
// the module imports (host.mjs says so; a function it provides beyond
// them would be untested code, one it lacks fails instantiation).
func TestHostProvidesTheImports(t *testing.T) {
	r := run(t, perIP, 1, nil, step{"op": "imports"})
	mustStart(t, r)
	if len(r[1].Module) == 0 || !slices.Equal(r[1].Module, r[1].Host) {
		t.Errorf("module imports %v\nhost provides  %v", r[1].Module, r[1].Host)
	}
}
