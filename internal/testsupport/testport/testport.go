// Package testport hands out loopback TCP ports to tests that start servers
// as separate processes (redis-server, tokengate-rls, the local host): those
// take a port number, not a listener, so the port is free when picked and
// bound a moment later by another process.
//
// Two things can take such a port in between, and both were seen failing
// `make test`:
//
//   - another pick. The kernel's port 0 hands out ports at random, and a
//     port given back by a probe listener can be handed out again before
//     the first server has bound it (three cluster nodes where two shared a
//     port became a cluster of two);
//   - a client socket. The kernel gives every outgoing connection a port of
//     its ephemeral range, so a port picked there can be a client's by the
//     time the server binds it.
//
// Ports are therefore picked below the ephemeral range, and each pick is
// reserved until the test ends: in this process by a set, and across the
// test processes `go test` runs in parallel (and other checkouts on the
// machine) by an flock on a file named after the port in a shared
// directory. The kernel drops the lock when a process dies, so a crashed
// test leaves nothing reserved.
package testport

import (
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

var (
	mu    sync.Mutex
	taken = map[int]bool{}
)

// Free returns a port on 127.0.0.1 that nothing listens on and that no
// other test (in any process using this package) gets until t ends.
func Free(t testing.TB) int {
	t.Helper()
	return Run(t, 1)
}

// Run returns a port p such that p .. p+n-1 are all free and reserved for
// t, for programs that derive ports from one (a proxy at p and its admin
// listener at p+1).
func Run(t testing.TB, n int) int {
	t.Helper()
	lo, hi := bounds()
	for range 500 {
		p := lo + rand.IntN(hi-lo-n)
		mu.Lock()
		held, ok := reserve(p, n)
		mu.Unlock()
		if ok {
			t.Cleanup(func() {
				mu.Lock()
				defer mu.Unlock()
				release(held)
			})
			return p
		}
	}
	t.Fatalf("testport: no %d adjacent free ports in [%d, %d)", n, lo, hi)
	return 0
}

// bounds is the range picks come from: below the ephemeral range
// (net.ipv4.ip_local_port_range, 32768 by default) and above the ports
// system services commonly use.
func bounds() (lo, hi int) {
	lo, hi = 20000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if eph, err := strconv.Atoi(f[0]); err == nil && eph < hi {
				hi = eph
			}
		}
	}
	if hi-lo < 2000 {
		lo = max(hi-12000, 1024)
	}
	return lo, hi
}

// held is one reservation: the ports and their lock files.
type held struct {
	ports []int
	locks []*os.File
}

// reserve takes p .. p+n-1 when each is neither reserved here nor locked by
// another process, and is free to bind now. The caller holds mu.
func reserve(p, n int) (held, bool) {
	var h held
	for i := range n {
		q := p + i
		if taken[q] {
			release(h)
			return held{}, false
		}
		f, ok := lock(q)
		if !ok {
			release(h)
			return held{}, false
		}
		h.locks = append(h.locks, f)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
		if err != nil {
			release(h)
			return held{}, false
		}
		l.Close()
		h.ports = append(h.ports, q)
		taken[q] = true
	}
	return h, true
}

// release gives the ports and their locks back; the caller holds mu.
func release(h held) {
	for _, q := range h.ports {
		delete(taken, q)
	}
	for _, f := range h.locks {
		if f != nil {
			f.Close() // closing the last descriptor drops the flock
		}
	}
}

// lock takes an exclusive, non-blocking flock on the port's file in the
// shared directory. Without the directory (a read-only temp) the
// in-process set still works.
func lock(p int) (*os.File, bool) {
	dir := filepath.Join(os.TempDir(), "tokengate-testport")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}
