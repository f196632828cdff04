package redistest

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) on
// 127.0.0.1 monitoring master under the name set, with a quorum of one,
// and waits until it names master's address for set. It is stopped when
// the test ends.
func StartSentinel(t testing.TB, set string, master *Server) *Server {
	t.Helper()
	bin, _ := Require(t, false)
	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	// Sentinel rewrites its configuration file: it must be writable.
	text := "sentinel monitor " + set + " 127.0.0.1 " + strconv.Itoa(master.Port) + " 1\n" +
		"sentinel down-after-milliseconds " + set + " 1000\n" +
		"sentinel failover-timeout " + set + " 3000\n"
	if master.password != "" {
		text += "sentinel auth-pass " + set + " " + master.password + "\n"
	}
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, t: t, dir: dir,
		logPath: filepath.Join(dir, "sentinel.log")}
	s.args = []string{bin, conf, "--sentinel", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--logfile", s.logPath}
	t.Cleanup(s.Kill)
	s.start()
	s.waitPing()
	want := []any{"127.0.0.1", strconv.Itoa(master.Port)}
	waitFor(t, func() (bool, any) {
		v, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", set)
		a, _ := v.([]any)
		return err == nil && len(a) == 2 && a[0] == want[0] && a[1] == want[1], v
	})
	return s
}

// waitFor polls ok every 50 ms until it reports true, failing the test
// after readyTimeout with the last value it gave.
func waitFor(t testing.TB, ok func() (bool, any)) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		done, last := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: not ready within %v; last: %v", readyTimeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
