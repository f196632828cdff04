package e2e

import (
	"bytes"
	"encoding/json"
	"net"
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
	"github.com/tokengate/tokengate/internal/testsupport/testport"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// TestClusterExampleIsOneConfiguration: tokengate-rls reads
// examples/cluster/cluster.json and the proxies the plugin configuration
// inlined in examples/cluster/envoy.yaml; they must say the same.
func TestClusterExampleIsOneConfiguration(t *testing.T) {
	root := repoRoot(t)
	js, err := os.ReadFile(filepath.Join(root, "examples", "cluster", "cluster.json"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "examples", "cluster", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	oneConfiguration(t, "examples/cluster: cluster.json", js, doc)
}

// oneConfiguration checks that an example's JSON (what tokengate-rls reads,
// named name) and the plugin configuration its envoy.yaml (doc) inlines
// for the proxies say the same, and that the service's cluster is where
// tools/cluster.sh starts it.
func oneConfiguration(t *testing.T, name string, js, doc []byte) {
	t.Helper()
	p, err := envoyconf.Find(doc, "")
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal(js, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(p.Configuration, &b); err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Errorf("%s and envoy.yaml's configuration differ:\n%s\n%s", name, ja, jb)
	}
	cls, err := envoyconf.Clusters(doc)
	if err != nil {
		t.Fatal(err)
	}
	if c := cls["tokengate_rls"]; !c.HTTP2 || c.Address != "127.0.0.1:8081" {
		t.Errorf("cluster tokengate_rls %+v, want HTTP/2 at 127.0.0.1:8081 (tools/cluster.sh starts it there)", c)
	}
}

// TestMakeCluster runs tools/cluster.sh (`make cluster`) on free ports with
// binaries built by the test, with two proxies instead of three (each
// compiles the module as it starts, seconds apiece on a busy machine; the
// fleet tests cover three): the fleet comes up, the proxies share one
// bucket per client IP, and SIGINT (Ctrl-C) stops every process; in both
// modes (MODE=lease: the rule in lease mode, docs/lease.md).
func TestMakeCluster(t *testing.T) {
	for _, mode := range []string{"exact", "lease"} {
		t.Run(mode, func(t *testing.T) { testMakeCluster(t, mode) })
	}
}

func testMakeCluster(t *testing.T, mode string) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	redistest.Require(t, true) // the script needs redis-server and redis-cli
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("tools/cluster.sh needs curl")
	}
	f := startScriptFleet(t, "tools/cluster.sh", func(root string, vars []string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(root, "tools", "cluster.sh"))
		cmd.Env = append(os.Environ(), append(vars, "MODE="+mode)...)
		return cmd
	})
	cmd, out, exited, ports, dir := f.cmd, f.out, f.exited, f.ports, f.dir
	rlsPort, redisPort := f.rlsPort, f.redisPort
	for _, want := range append([]string{"http://127.0.0.1:" + ports[0], "curl", "in " + mode + " mode"}, ports...) {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the banner does not mention %q", want)
		}
	}

	// The example's rule: bursts of 6, 2 a second, per client IP across
	// the fleet. Six rounds over the two proxies.
	t0 := time.Now()
	admitted := 0
	for range 6 {
		for _, p := range ports {
			resp, err := http.Get("http://127.0.0.1:" + p + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				admitted++
			case http.StatusTooManyRequests:
			default:
				t.Errorf("proxy %s: status %d", p, resp.StatusCode)
			}
		}
	}
	// In lease mode the other proxies' allowances (lease_max 2 each) may
	// hold tokens back: wrong rejections, never over the limit.
	lower := 6
	if mode == "lease" {
		lower = 6 - 2*(len(ports)-1)
	}
	// A call that timed out (timeout_ms 60 on a loaded machine) is decided
	// by on_error "local" in that proxy alone, by design: each such request
	// may be one more.
	fallbacks := 0
	for _, p := range ports {
		b, _ := os.ReadFile(filepath.Join(dir, "proxy-"+p+".log"))
		fallbacks += strings.Count(string(b), "event=rls_error reason=")
	}
	t.Logf("%s mode: the fleet admitted %d of 12 in %.2fs, %d decided by on_error local", mode, admitted, time.Since(t0).Seconds(), fallbacks)
	if upper := 6 + 2*time.Since(t0).Seconds() + 1 + float64(fallbacks); admitted < lower || float64(admitted) > upper {
		t.Errorf("the fleet admitted %d of 12, want %d to %.1f (one bucket for every proxy; %d decided by on_error local)",
			admitted, lower, upper, fallbacks)
	}

	if mode == "lease" {
		checkLeased(t, ports)
	}

	// Ctrl-C in a terminal signals the whole foreground process group.
	// The children run in sessions of their own, so only the script gets
	// it and stops them in order: no proxy ends first as if it had failed
	// (issue 22, item 12), and the script exits 0.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("tools/cluster.sh still running 20 s after SIGINT")
	}
	if f.waitErr != nil || strings.Contains(out.String(), "a proxy exited") {
		t.Errorf("after Ctrl-C: exit %v, output:\n%s", f.waitErr, out.String())
	}
	for _, p := range append(ports, strconv.Itoa(rlsPort), strconv.Itoa(redisPort)) {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+p, time.Second); err == nil {
			c.Close()
			t.Errorf("port %s still answers after Ctrl-C", p)
		}
	}
}

// scriptFleet is tools/cluster.sh running (directly or under make) with
// binaries the test built, on ports reserved for it.
type scriptFleet struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{} // closed once cmd has exited
	// waitErr is cmd.Wait's result, read after exited is closed.
	waitErr                      error
	ports                        []string // the proxies' (each admin listener at +1)
	rlsPort, rlsAdmin, redisPort int
	dir                          string // CLUSTER_DIR: the processes' logs
}

// startScriptFleet starts a fleet of two proxies with the command that
// command makes, given the repository root and the variables naming the
// binaries and ports (for its environment or its command line), in a
// process group of its own that is killed when the test ends, and waits
// for the banner. name is the command in failure messages.
func startScriptFleet(t *testing.T, name string, command func(root string, vars []string) *exec.Cmd) *scriptFleet {
	t.Helper()
	root := repoRoot(t)
	wasm, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	localBin, rlsBin := buildLocal(t), tokengateRLS(t)
	f := &scriptFleet{out: &syncBuffer{}, exited: make(chan struct{}), dir: t.TempDir()}
	for range 2 {
		f.ports = append(f.ports, strconv.Itoa(freePortPair(t)))
	}
	f.rlsPort, f.rlsAdmin, f.redisPort = freePortNum(t), freePortNum(t), freePortNum(t)
	cmd := command(root, []string{
		"CLUSTER_PORTS=" + strings.Join(f.ports, " "),
		"CLUSTER_RLS_PORT=" + strconv.Itoa(f.rlsPort), "CLUSTER_RLS_ADMIN_PORT=" + strconv.Itoa(f.rlsAdmin),
		"CLUSTER_REDIS_PORT=" + strconv.Itoa(f.redisPort), "CLUSTER_DIR=" + f.dir,
		"LOCAL=" + localBin, "RLS=" + rlsBin, "WASM=" + wasm})
	f.cmd = cmd
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = f.out, f.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait returns even if a straggler holds the output pipe open.
	cmd.WaitDelay = 5 * time.Second
	go func() { f.waitErr = cmd.Wait(); close(f.exited) }()
	t.Cleanup(func() {
		select {
		case <-f.exited:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the group this test started
			<-f.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, f.out.String())
		}
	})
	deadline := time.Now().Add(120 * time.Second)
	for !strings.Contains(f.out.String(), "Ctrl-C to stop everything.") {
		select {
		case <-f.exited:
			t.Fatalf("%s exited early: %v", name, f.waitErr)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the fleet did not come up in 120 s")
		}
	}
	return f
}

// freePortNum returns a port reserved for the test (testport).
func freePortNum(t testing.TB) int {
	t.Helper()
	return testport.Free(t)
}

// freePortPair returns a port p such that p and p+1 are reserved for the
// test (a proxy and its admin listener).
func freePortPair(t testing.TB) int {
	t.Helper()
	return testport.Run(t, 2)
}

// checkLeased checks, on the proxies' admin listeners, that lease mode took
// leases: lease calls were made, and some proxy's shared data holds an
// allowance record with a grant.
func checkLeased(t *testing.T, ports []string) {
	t.Helper()
	calls, granted := 0.0, 0
	for _, p := range ports {
		n, _ := strconv.Atoi(p)
		admin := "http://127.0.0.1:" + strconv.Itoa(n+1)
		_, stats := getURL(t, admin+"/stats", nil)
		for _, line := range strings.Split(stats, "\n") {
			if strings.Contains(line, "lease_calls") && !strings.HasPrefix(line, "#") {
				v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				calls += v
			}
		}
		_, shared := getURL(t, admin+"/shared_data", nil)
		for _, line := range strings.Split(shared, "\n") {
			// "tl:fleet-per-ip:127.0.0.1" cas=N value="tokens:expiry:grant:..."
			if !strings.HasPrefix(line, `"tl:`) || strings.HasPrefix(line, `"tl:holder"`) {
				continue
			}
			_, v, _ := strings.Cut(line, "value=")
			if fs := strings.Split(strings.Trim(v, `"`), ":"); len(fs) > 2 && fs[2] != "0" {
				granted++
			}
		}
	}
	t.Logf("lease mode: %.0f lease calls, %d allowance records with a grant", calls, granted)
	if calls == 0 || granted == 0 {
		t.Errorf("lease mode took no lease: %.0f lease calls, %d allowance records with a grant", calls, granted)
	}
}

// TestMakeClusterCtrlC (issue 22, item 12): Ctrl-C on `make cluster` (the
// terminal's SIGINT to make, its recipe and the script) stops the fleet
// without an error line from make: the recipe execs the script, which
// traps SIGINT and exits 0, so make has no dying shell to report
// ("make: *** [Makefile:…: cluster] Interrupt", or Error 1 when the shell
// exited 1). make itself still ends by the SIGINT, silently.
func TestMakeClusterCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	redistest.Require(t, true)
	for _, tool := range []string{"curl", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skip("make cluster needs " + tool)
		}
	}
	f := startScriptFleet(t, "make cluster", func(_ string, vars []string) *exec.Cmd {
		// The binaries the test built, on make's command line (so that
		// make builds nothing) and in the environment (the script reads
		// them there, and the ports).
		args := []string{"--no-print-directory", "cluster", "MODE=exact"}
		for _, v := range vars {
			if name, _, _ := strings.Cut(v, "="); name == "LOCAL" || name == "RLS" || name == "WASM" {
				args = append(args, v)
			}
		}
		cmd := exec.Command("make", args...)
		cmd.Env = append(os.Environ(), append(vars, "MODE=exact")...)
		return cmd
	})
	cmd, out, exited, ports := f.cmd, f.out, f.exited, f.ports
	rlsPort, redisPort := f.rlsPort, f.redisPort
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("make cluster still running 20 s after SIGINT")
	}
	if s := out.String(); strings.Contains(s, "***") || strings.Contains(s, "a proxy exited") {
		t.Errorf("Ctrl-C: make or the script reported an error:\n%s", s)
	}
	for _, p := range append(ports, strconv.Itoa(rlsPort), strconv.Itoa(redisPort)) {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+p, time.Second); err == nil {
			c.Close()
			t.Errorf("port %s still answers after Ctrl-C", p)
		}
	}
}
