package e2e

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/envoyconf"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// aiExample reads examples/ai-api: the JSON tokengate-rls reads, and the
// proxies' envoy.yaml.
func aiExample(t *testing.T) (js, envoy []byte) {
	t.Helper()
	root := repoRoot(t)
	js, err := os.ReadFile(filepath.Join(root, "examples", "ai-api", "ai-api.json"))
	if err != nil {
		t.Fatal(err)
	}
	envoy, err = os.ReadFile(filepath.Join(root, "examples", "ai-api", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return js, envoy
}

// TestAIAPIExampleIsOneConfiguration: tokengate-rls reads
// examples/ai-api/ai-api.json and the proxies the configuration inlined in
// its envoy.yaml; they must say the same, and the service's cluster be
// where tools/cluster.sh starts it.
func TestAIAPIExampleIsOneConfiguration(t *testing.T) {
	js, doc := aiExample(t)
	oneConfiguration(t, "examples/ai-api: ai-api.json", js, doc)
}

// TestAIAPIExample: the example's configuration is accepted by the built
// module (the plugin configures, nothing refused) and by tokengate-rls
// (it loads it and gets ready), and together on a real Redis they do what
// the example says: a request without x-api-key is refused; a response
// reporting more usage than both budgets hold (30000 tokens) is charged
// in full after it, so the key's next request is refused by the service,
// which the upstream never sees.
func TestAIAPIExample(t *testing.T) {
	js, doc := aiExample(t)
	p, err := envoyconf.Find(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, string(js), redis.Addr)
	bootstrap := strings.Replace(string(doc), "port_value: 8081 }", "port_value: "+rls.Addr[strings.LastIndexByte(rls.Addr, ':')+1:]+" }", 1)
	up := &billingUpstream{}
	h, srv := startSettleFleetHost(t, string(p.Configuration), bootstrap, up)
	if v, _ := h.Metric("tokengate.config_rejected"); v != 0 {
		t.Fatalf("the module refused the example's configuration (%d)", v)
	}
	c := srv.Client()
	ended := uint64(0)
	post := func(key string, tokens, maxTokens int) response {
		t.Helper()
		hd := map[string]string{}
		if key != "" {
			hd["x-api-key"] = key
		}
		r, err := doBody(c, srv, "/v1/chat/completions?tokens="+strconv.Itoa(tokens), hd, `{"model":"m","max_tokens":`+strconv.Itoa(maxTokens)+`}`)
		if err != nil {
			t.Fatal(err)
		}
		ended++
		waitStreamsEnded(t, h, ended)
		return r
	}
	if r := post("", 10, 10); r.status == 200 {
		t.Errorf("without x-api-key: 200, want a refusal (on_missing_key deny)")
	}
	if r := post("demo", 30000, 1000); r.status != 200 {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	waitFor(t, func() bool { v, _ := h.Metric("tokengate.rls_settle_calls"); return v >= 1 })
	// The settlement is a call of its own, answered after the response:
	// wait until the service has applied it (the minute's bucket in debt).
	waitFor(t, func() bool {
		v := redisTokens(t, redis, "tb:{ai-tokens-per-minute:demo}")
		f, err := strconv.ParseFloat(v, 64)
		return err == nil && f < 0
	})
	r := post("demo", 10, 10)
	if r.status != 429 {
		t.Fatalf("after 30000 tokens: %d, want 429 from the service", r.status)
	}
	if got := up.served.Load(); got != 1 {
		t.Errorf("the upstream served %d requests, want 1", got)
	}
	if v, _ := h.Metric("tokengate.rls_settle_errors"); v != 0 {
		t.Errorf("rls_settle_errors: %d", v)
	}
}

// TestMakeClusterAIAPI runs `make cluster EXAMPLE=ai-api` on free ports with
// binaries the test built (two proxies): the fleet comes up with the
// example's banner, shares the minute's 6000 tokens across the proxies
// (requests of max_tokens 1500, which the echo upstream's unreported usage
// leaves charged), and Ctrl-C stops it.
func TestMakeClusterAIAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	redistest.Require(t, true)
	for _, tool := range []string{"curl", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("make cluster needs " + tool)
		}
	}
	f := startScriptFleet(t, "make cluster EXAMPLE=ai-api", func(_ string, vars []string) *exec.Cmd {
		args := []string{"--no-print-directory", "cluster", "EXAMPLE=ai-api"}
		for _, v := range vars {
			if name, _, _ := strings.Cut(v, "="); name == "LOCAL" || name == "RLS" || name == "WASM" {
				args = append(args, v)
			}
		}
		cmd := exec.Command("make", args...)
		cmd.Env = append(os.Environ(), vars...)
		return cmd
	})
	for _, want := range []string{"An AI API", "ai-tokens-per-month", "x-api-key"} {
		if !strings.Contains(f.out.String(), want) {
			t.Errorf("the banner does not mention %q", want)
		}
	}
	t0 := time.Now()
	admitted, refused := 0, 0
	for range 4 {
		for _, p := range f.ports {
			req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+p+"/v1/chat/completions", strings.NewReader(`{"max_tokens":1500}`))
			req.Header.Set("x-api-key", "demo")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				admitted++
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Errorf("proxy %s: status %d", p, resp.StatusCode)
			}
		}
	}
	// 6000 tokens at once, 100 more a second, for every proxy together. A
	// call that failed (on_error allow) lets a request through unchecked.
	fallbacks := 0
	for _, p := range f.ports {
		b, _ := os.ReadFile(filepath.Join(f.dir, "proxy-"+p+".log"))
		fallbacks += strings.Count(string(b), "event=rls_error reason=")
	}
	upper := 4 + int(100*time.Since(t0).Seconds()/1500) + 1 + fallbacks
	t.Logf("the fleet admitted %d of 8 requests of 1500 tokens in %.2fs (%d failed calls)", admitted, time.Since(t0).Seconds(), fallbacks)
	if admitted < 4 || admitted > upper || refused == 0 && admitted < 8 {
		t.Errorf("admitted %d, refused %d of 8; want 4 to %d admitted (one budget for the fleet)", admitted, refused, upper)
	}
	if err := syscall.Kill(-f.cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("make cluster EXAMPLE=ai-api still running 20 s after SIGINT")
	}
	if s := f.out.String(); strings.Contains(s, "***") || strings.Contains(s, "a proxy exited") {
		t.Errorf("Ctrl-C: make or the script reported an error:\n%s", s)
	}
}
