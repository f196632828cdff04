// Package redistest starts real redis-server processes for tests: one
// node, or a Redis Cluster of several masters, on 127.0.0.1 with free
// ports, and stops them when the test ends. Nodes can be killed and
// restarted for fault tests.
//
// When redis-server (or, for a cluster, redis-cli) is not installed the
// test is skipped, unless $TOKENGATE_REQUIRE_REDIS is set (.ci/run sets it
// after installing redis-server and redis-tools with apt), in which case
// it fails.
//
// The package talks to Redis with a minimal RESP client of its own (Do), so
// tests judge the product's Redis code with code that does not share it.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/testport"
)

// readyTimeout bounds every wait for a node or a cluster to become ready.
const readyTimeout = 20 * time.Second

// Server is one redis-server process.
type Server struct {
	// Addr is "127.0.0.1:port".
	Addr string
	// Port is the client port; BusPort the cluster bus port (0 when not a
	// cluster node).
	Port, BusPort int

	// password is --requirepass's, when extra set one: Do authenticates
	// with it.
	password string

	t       testing.TB
	dir     string
	args    []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
}

// Require returns the paths of redis-server and redis-cli, skipping the test
// when they are missing (failing it when $TOKENGATE_REQUIRE_REDIS is set).
// needCLI asks for redis-cli too (a cluster is created with it).
func Require(t testing.TB, needCLI bool) (server, cli string) {
	t.Helper()
	missing := func(name string) {
		t.Helper()
		msg := name + " is not installed (apt-get install redis-server redis-tools)"
		if os.Getenv("TOKENGATE_REQUIRE_REDIS") != "" {
			t.Fatal(msg + ", and TOKENGATE_REQUIRE_REDIS is set (.ci/run sets it after installing Redis)")
		}
		t.Skip(msg)
	}
	server, err := exec.LookPath("redis-server")
	if err != nil {
		missing("redis-server")
	}
	if needCLI {
		if cli, err = exec.LookPath("redis-cli"); err != nil {
			missing("redis-cli")
		}
	}
	return server, cli
}

// Start starts one redis-server (no persistence, DEBUG enabled so tests can
// use DEBUG SLEEP) and waits until it answers PING. It is stopped when the
// test ends. extra are more configuration directives as command-line
// arguments ("--maxmemory", "10mb").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin, _ := Require(t, false)
	s := newServer(t, bin, false, extra)
	s.start()
	s.waitPing()
	return s
}

func newServer(t testing.TB, bin string, cluster bool, extra []string) *Server {
	t.Helper()
	dir := t.TempDir()
	port := freePort(t)
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, t: t, dir: dir,
		logPath: filepath.Join(dir, "redis.log")}
	s.args = []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--enable-debug-command", "yes",
		"--logfile", s.logPath,
	}
	if cluster {
		s.BusPort = freePort(t)
		s.args = append(s.args,
			"--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(s.BusPort),
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "3000",
			// A dead master must not take the other masters' slots down.
			"--cluster-require-full-coverage", "no",
		)
	}
	s.args = append(s.args, extra...)
	for i, a := range extra {
		if a == "--requirepass" && i+1 < len(extra) {
			s.password = extra[i+1]
		}
	}
	s.args = append([]string{bin}, s.args...)
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.t.Fatalf("redistest: %s is already running", s.Addr)
	}
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Dir = s.dir
	setPdeathsig(cmd)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
}

// Kill stops the process at once (SIGKILL) and waits for it to exit. It does
// nothing when the server is not running. Data is lost (no persistence); a
// cluster node keeps its nodes.conf and rejoins with its slots on Restart.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Stop stops the process cleanly, as an operator's restart does
// (SIGTERM: Redis writes its append-only file or snapshot out and exits),
// and waits for it to exit, at most 20 s; Restart starts it again on the
// same port and directory, which with "--appendonly", "yes" keeps every
// write acknowledged before the stop.
func (s *Server) Stop() {
	s.t.Helper()
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(readyTimeout):
		_ = cmd.Process.Kill()
		<-done
		s.t.Fatalf("redistest: %s did not stop within %v of SIGTERM; log:\n%s", s.Addr, readyTimeout, s.Log())
	}
}

// Restart starts a killed or stopped server again on the same port and directory and
// waits until it answers PING (and, for a cluster node, until it sees the
// cluster as ok).
func (s *Server) Restart() {
	s.t.Helper()
	s.start()
	s.waitPing()
	if s.BusPort != 0 {
		s.waitClusterOK(0)
	}
}

// Running reports whether the process has been started and not killed.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Log returns what the server has logged so far (for failure messages).
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

func (s *Server) waitPing() {
	s.t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		if s.exited() {
			s.t.Fatalf("redistest: redis-server for %s exited at start; log:\n%s", s.Addr, s.Log())
		}
		v, err := s.Do("PING")
		if err == nil && v == "PONG" {
			s.checkOwn()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: %s did not answer PING within %v (last: %v %v); log:\n%s",
				s.Addr, readyTimeout, v, err, s.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exited reports whether the process started last has ended.
func (s *Server) exited() bool {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// checkOwn fails the test when the server answering on Addr is not the
// process this Server started: a test that went on would judge someone
// else's Redis (a port taken between its pick and the bind).
func (s *Server) checkOwn() {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	v, err := s.Do("INFO", "server")
	info, _ := v.(string)
	if err != nil {
		s.t.Fatalf("redistest: INFO server on %s: %v", s.Addr, err)
	}
	want := "process_id:" + strconv.Itoa(cmd.Process.Pid)
	if !strings.Contains(info, want+"\r\n") && !strings.Contains(info, want+"\n") {
		s.t.Fatalf("redistest: %s is answered by another process than ours (want %s); log:\n%s", s.Addr, want, s.Log())
	}
}

// Do sends one command on a new connection and returns the reply: a string
// (simple string or bulk; nil for a null bulk), an int64, or a []any. A Redis
// error reply is returned as an error. The call is bounded by 5 s, longer
// than any DEBUG SLEEP a test should use.
func (s *Server) Do(args ...string) (any, error) {
	return doAuth(s.Addr, s.password, 5*time.Second, args...)
}

// MustDo is Do that fails the test on an error.
func (s *Server) MustDo(args ...string) any {
	s.t.Helper()
	v, err := s.Do(args...)
	if err != nil {
		s.t.Fatalf("redistest: %s %q: %v", s.Addr, args, err)
	}
	return v
}

// doAuth sends one command on a new connection to addr that first
// authenticates with password (none when empty), bounded by timeout.
func doAuth(addr, password string, timeout time.Duration, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(conn)
	if password != "" {
		if _, err := send(conn, r, "AUTH", password); err != nil {
			return nil, err
		}
	}
	return send(conn, r, args...)
}

func send(conn net.Conn, r *bufio.Reader, args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return readReply(r)
}

// ErrorReply is an error reply from Redis ("-ERR ...").
type ErrorReply string

func (e ErrorReply) Error() string { return string(e) }

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("redistest: empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, ErrorReply(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		out := make([]any, n)
		for i := range out {
			// An error inside an array (EXEC) is kept as a value.
			v, err := readReply(r)
			var er ErrorReply
			if errors.As(err, &er) {
				v, err = er, nil
			}
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("redistest: unexpected reply %q", line)
}

// freePort returns a port on 127.0.0.1 reserved for the test (see
// testport: picked below the ephemeral range, never handed to two tests).
func freePort(t testing.TB) int {
	t.Helper()
	return testport.Free(t)
}
