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
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/wasmbuild"
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
		Cluster string      `json:"cluster"`
		Headers [][2]string `json:"headers"`
		Timeout int         `json:"timeout"`
		Body    []byte      `json:"body"`
	} `json:"calls"`
	Statuses map[string]int `json:"statuses"`
	Entries  []struct {
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

// node returns the path of node, or skips: .ci/run installs it.
func node(t *testing.T) string {
	t.Helper()
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
	if r[5].Value == "0" || r[6].Value != "0" {
		t.Errorf("shadow rule: shadow_rejected %s, rejected %s; want counts without rejections", r[5].Value, r[6].Value)
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
	if r[2].Status != 200 || r[2].header("grpc-status") != "8" || r[2].header("content-type") != "application/grpc" {
		t.Errorf("gRPC rejection: %d %v", r[2].Status, r[2].Headers)
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
	} else if c := ok.Calls[0]; c.Cluster != "rls" || c.Timeout != 30 || !bytes.Contains(c.Body, []byte("global")) {
		t.Errorf("call %+v", c)
	}
	if over.Status != 429 || over.Continued != 0 || over.header("x-tokengate-rule") != "global" || over.header("retry-after") < "3" {
		t.Errorf("rejected: %d continued %d %v", over.Status, over.Continued, over.Headers)
	}
	if failed.Status != 200 || failed.Continued != 1 {
		t.Errorf("failed call, on_error allow: %d continued %d", failed.Status, failed.Continued)
	}
	for _, e := range r[4].Entries {
		// Three requests reached the local bucket; the rejected one was
		// refunded: 5 - 2 = 3.
		if strings.HasPrefix(e.Key, "tb:local:") && !strings.HasPrefix(e.Value, "3.000000:") {
			t.Errorf("local bucket %q, want 3 tokens", e.Value)
		}
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
	out, err := exec.Command(n, "--no-liftoff", "../../bench/v8/bench.mjs", wasm, "50", "1").Output()
	if err != nil {
		t.Fatalf("bench.mjs: %v %s", err, out)
	}
	var res struct {
		Cases map[string]struct {
			NsPerReq  float64 `json:"nsPerReq"`
			HostCalls float64 `json:"hostCalls"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, name := range []string{"o-no-filter", "a-passthrough", "b-one-rule", "c-four-rules", "d-rejected", "e-100000-ips"} {
		if c, ok := res.Cases[name]; !ok || !(c.NsPerReq > 0) {
			t.Errorf("case %s: %+v", name, c)
		}
	}
	if a, b := res.Cases["a-passthrough"].HostCalls, res.Cases["b-one-rule"].HostCalls; a != 1 || b <= a {
		t.Errorf("host calls per request: passthrough %v, one rule %v; want 1 and more", a, b)
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
	for _, name := range []string{"a-passthrough", "b-one-rule", "c-four-rules", "d-rejected", "e-100000-ips", "x: one rule", "y: one rule"} {
		if !bytes.Contains(out, []byte(name)) {
			t.Errorf("no %q in the output:\n%s", name, out)
		}
	}
}
