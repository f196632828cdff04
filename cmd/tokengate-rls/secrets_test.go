package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// dropinProc is the program started as ratelimit in a child process,
// its stdout and stderr kept whole.
type dropinProc struct {
	cmd            *exec.Cmd
	mu             sync.Mutex
	stdout, stderr bytes.Buffer
	serving        chan map[string]any
	exited         chan struct{}
}

// output is everything the child wrote so far.
func (p *dropinProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String() + p.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}

// startDropinProc runs main as ratelimit with the drop-in's environment
// env (JSON logs at debug) added to this process's.
func startDropinProc(t *testing.T, env ...string) *dropinProc {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runMainEnv+"=ratelimit", "HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0",
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0", "USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_TIMEOUT=200ms",
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=rl", "LOG_LEVEL=debug", "LOG_FORMAT=json")
	cmd.Env = append(cmd.Env, env...)
	p := &dropinProc{cmd: cmd, serving: make(chan map[string]any, 1), exited: make(chan struct{})}
	cmd.Stdout = lockedWriter{&p.mu, &p.stdout}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.Write(sc.Bytes())
			p.stderr.WriteByte('\n')
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "envoyproxy/ratelimit drop-in serving" {
				p.serving <- m
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// stop ends the child with SIGTERM and waits for it.
func (p *dropinProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the drop-in did not stop within 20 s of SIGTERM")
	}
}

// TestDropinPasswordNotLogged: the drop-in started as ratelimit with a
// REDIS_URL holding a password, REDIS_AUTH and
// CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS never writes the secrets to
// stdout or stderr, at debug level: not in the start's line (which shows
// the URL with "xxxxx"), not in Redis's connection errors while Redis is
// unreachable or refuses the credentials, not in the errors that stop the
// start. Before (issue 30), the URL was printed whole at info level.
func TestDropinPasswordNotLogged(t *testing.T) {
	const secret = "S3cretPW-7f1c"
	for _, tc := range []struct {
		name string
		// url is REDIS_URL, with %s for the address.
		url    string
		real   bool // a real Redis that knows the user
		wrong  bool // a real Redis whose password differs
		failed bool // the start fails
	}{
		{name: "unreachable", url: "redis://svc:" + secret + "@127.0.0.1:1"},
		{name: "unreachable-tls", url: "rediss://svc:" + secret + "@127.0.0.1:1"},
		{name: "real", url: "redis://svc:" + secret + "@%s", real: true},
		{name: "wrong-password", url: "redis://svc:" + secret + "@%s", wrong: true},
		{name: "bad-database", url: "redis://svc:" + secret + "@127.0.0.1:1/3", failed: true},
		{name: "bad-port", url: "redis://svc:" + secret + "@127.0.0.1:port", failed: true},
		{name: "no-scheme", url: "svc:" + secret + "@127.0.0.1:1", failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if tc.real || tc.wrong {
				pw := secret
				if tc.wrong {
					pw = "another-one"
				}
				srv := redistest.Start(t, "--user", "svc", "on", ">"+pw, "~*", "+@all")
				url = strings.Replace(url, "%s", srv.Addr, 1)
			}
			p := startDropinProc(t, "REDIS_URL="+url, "REDIS_AUTH=other:"+secret+"-auth",
				"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer "+secret+"-hdr")
			if tc.failed {
				select {
				case <-p.exited:
				case <-time.After(20 * time.Second):
					t.Fatal("the start did not fail within 20 s")
				}
				if !strings.Contains(p.output(), "REDIS_URL") {
					t.Errorf("the start's error does not name REDIS_URL:\n%s", p.output())
				}
			} else {
				var line map[string]any
				select {
				case line = <-p.serving:
				case <-p.exited:
					t.Fatalf("exited before serving:\n%s", p.output())
				case <-time.After(20 * time.Second):
					t.Fatalf("not serving within 20 s:\n%s", p.output())
				}
				if got, _ := line["redis"].(string); !strings.Contains(got, "svc:xxxxx@") {
					t.Errorf("the start's line shows redis=%q, want the URL with the password as xxxxx", got)
				}
				health := "http://" + line["http"].(string) + "/healthcheck"
				conn, err := grpc.NewClient(line["grpc"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				call := func() (*rlsv3.RateLimitResponse, error) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					return rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "a",
						Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
				}
				if tc.real {
					waitFor(t, "/healthcheck 200", func() bool { code, _ := get(t, health); return code == http.StatusOK })
					if r, err := call(); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						t.Errorf("a call with the right password: %v %v, want OK", r, err)
					}
				} else {
					// Calls that fail, each a Redis error the log reports.
					for range 5 {
						if _, err := call(); err == nil {
							t.Error("a call decided without Redis")
						}
						time.Sleep(100 * time.Millisecond)
					}
					// The connection's own error, which the readiness
					// logs: refused, or the credentials refused.
					want := "connection refused"
					if tc.wrong {
						want = "WRONGPASS"
					}
					waitFor(t, "the connection error logged", func() bool { return strings.Contains(p.output(), want) })
				}
				p.stop(t)
			}
			if os.Getenv("SHOWOUT") != "" {
				t.Log(p.output())
			}
			if out := p.output(); strings.Contains(out, secret) {
				t.Errorf("the secret is in the drop-in's output:\n%s", out)
			}
		})
	}
}
