// Package envoyrl runs envoyproxy/ratelimit, the reference server of Envoy's
// rate-limit service API (RLS v3), as a real process on loopback: the peer
// the filter must interoperate with (e2e tests) and the rival tokengate-rls
// is measured against (bench/cmd/rlsload).
//
// The binary comes from tools/ratelimit.sh, which pins the version and
// installs it into build/tools with `go install` the first time. The server
// is configured the way its README describes: environment variables for the
// listeners and Redis, and one YAML file per domain under
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
//
//	bin, err := envoyrl.Install()
//	srv, err := envoyrl.Start(bin, envoyrl.Options{Redis: "127.0.0.1:6379", Config: yaml})
//	defer srv.Stop()
//	// srv.GRPC is the address of RateLimitService/ShouldRateLimit.
package envoyrl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

var (
	installOnce sync.Once
	installPath string
	installErr  error
)

// Install runs tools/ratelimit.sh (once per process) and returns the path
// of the envoyproxy/ratelimit binary it installed or found.
func Install() (string, error) {
	installOnce.Do(func() {
		root, err := wasmbuild.Root()
		if err != nil {
			installErr = err
			return
		}
		cmd := exec.Command(filepath.Join(root, "tools", "ratelimit.sh"))
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			installErr = fmt.Errorf("tools/ratelimit.sh: %v\n%s", err, stderr.Bytes())
			return
		}
		installPath = strings.TrimSpace(string(out))
	})
	return installPath, installErr
}

// Options configure one envoyproxy/ratelimit process.
type Options struct {
	// Redis is the Redis address, "host:port"; with Cluster, a
	// comma-separated list of Cluster nodes (REDIS_TYPE=CLUSTER).
	Redis   string
	Cluster bool
	// Config is the YAML of one domain (`domain: ...` and `descriptors:`),
	// written to the runtime directory as $RUNTIME_ROOT/ratelimit/config/tokengate.yaml.
	Config string
	// Files are more files of that directory (config/<name>), by name.
	Files map[string]string
	// PoolSize is REDIS_POOL_SIZE (the server's default, 10, when zero).
	PoolSize int
	// ResponseHeaders sets LIMIT_RESPONSE_HEADERS_ENABLED: the server adds
	// its RateLimit-Limit, -Remaining and -Reset headers to every answer.
	ResponseHeaders bool
	// Env is added to the environment last (overrides).
	Env []string
	// Log receives the server's stdout and stderr; nil discards them.
	Log io.Writer
}

// Server is a running envoyproxy/ratelimit.
type Server struct {
	// GRPC is the gRPC listener (RateLimitService), HTTP the HTTP one
	// (/json, /healthcheck), Debug the debug one; "127.0.0.1:port".
	GRPC, HTTP, Debug string

	cmd     *exec.Cmd
	dir     string
	done    chan struct{}
	waitErr error
}

// Start starts the server from the binary bin and returns once its HTTP
// health check answers 200 (the domain loaded, Redis answered PING), or an
// error with the server's output after 30 s or when it exits.
func Start(bin string, o Options) (*Server, error) {
	dir, err := os.MkdirTemp("", "envoyrl")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "ratelimit", "config"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "ratelimit", "config", "tokengate.yaml"), []byte(o.Config), 0o644); err != nil {
		return nil, err
	}
	for name, data := range o.Files {
		if err := os.WriteFile(filepath.Join(dir, "ratelimit", "config", name), []byte(data), 0o644); err != nil {
			return nil, err
		}
	}
	ports, err := freePorts(3)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{
		GRPC: "127.0.0.1:" + strconv.Itoa(ports[0]), HTTP: "127.0.0.1:" + strconv.Itoa(ports[1]),
		Debug: "127.0.0.1:" + strconv.Itoa(ports[2]), dir: dir, done: make(chan struct{}),
	}
	redisType := "SINGLE"
	if o.Cluster {
		redisType = "CLUSTER"
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[1]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[0]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(ports[2]),
		"USE_STATSD=false", "LOG_LEVEL=warn", "LOG_FORMAT=text",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=" + redisType, "REDIS_URL=" + o.Redis,
		// A request fails after 1 s instead of the default 10 s when Redis
		// stops answering; the tests look at on_error, not at this bound.
		"REDIS_TIMEOUT=1s",
		"RUNTIME_ROOT=" + dir, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"RUNTIME_IGNOREDOTFILES=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true",
	}
	if o.PoolSize > 0 {
		env = append(env, "REDIS_POOL_SIZE="+strconv.Itoa(o.PoolSize))
	}
	if o.ResponseHeaders {
		env = append(env, "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	}
	env = append(env, o.Env...)
	s.cmd = exec.Command(bin)
	s.cmd.Env = env
	s.cmd.Dir = dir
	var out lockedBuffer
	var w io.Writer = &out
	if o.Log != nil {
		w = io.MultiWriter(&out, o.Log)
	}
	s.cmd.Stdout, s.cmd.Stderr = w, w
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get("http://" + s.HTTP + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if c, err := net.DialTimeout("tcp", s.GRPC, time.Second); err == nil {
					c.Close()
					return s, nil
				}
			}
		}
		select {
		case <-s.done:
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("envoyproxy/ratelimit exited (%v):\n%s", s.waitErr, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = s.Stop()
			return nil, fmt.Errorf("envoyproxy/ratelimit not healthy after 30 s:\n%s", out.String())
		}
	}
}

// ConfigDir is the directory of the server's YAML files (it reloads them
// when one changes).
func (s *Server) ConfigDir() string { return filepath.Join(s.dir, "ratelimit", "config") }

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM, waits up to 5 s, then kills; it removes the runtime
// directory. It is safe to call twice.
func (s *Server) Stop() error {
	select {
	case <-s.done:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	_ = os.RemoveAll(s.dir)
	var ee *exec.ExitError
	if s.waitErr != nil && !errors.As(s.waitErr, &ee) {
		return s.waitErr
	}
	return nil
}

// freePorts returns n ports free on 127.0.0.1 a moment ago. The server
// binds them itself (it takes ports, not listeners), so another process
// could take one in between; Start then fails with the server's output.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil // bounded: the start of the log is what explains a failure
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
