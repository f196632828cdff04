package testport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestPicksAreDistinct: ports picked and not yet bound are never handed out
// twice (the kernel's port 0 can do that), and all are below the ephemeral
// range.
func TestPicksAreDistinct(t *testing.T) {
	_, hi := bounds()
	seen := map[int]bool{}
	for range 300 {
		p := Free(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		if p >= hi {
			t.Fatalf("port %d is in the ephemeral range (from %d)", p, hi)
		}
		seen[p] = true
	}
	p := Run(t, 2)
	if seen[p] || seen[p+1] {
		t.Fatalf("run %d..%d overlaps earlier picks", p, p+1)
	}
}

// TestReserveSkipsTakenPorts: a port another process holds the lock of, a
// port something listens on, and a port this process reserved are refused;
// once given back, the port is taken again.
func TestReserveSkipsTakenPorts(t *testing.T) {
	p := Free(t)
	mu.Lock()
	_, ok := reserve(p, 1)
	mu.Unlock()
	if ok {
		t.Fatalf("port %d reserved twice in one process", p)
	}

	// Another process's lock: a second open file description of the same
	// file conflicts with flock like another process would.
	q := p + 1
	for taken[q] {
		q++
	}
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "tokengate-testport", strconv.Itoa(q)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		t.Skipf("port %d is locked by another test process: %v", q, err)
	}
	mu.Lock()
	_, ok = reserve(q, 1)
	mu.Unlock()
	if ok {
		t.Fatalf("port %d reserved while another holder has its lock", q)
	}
	f.Close()
	mu.Lock()
	h, ok := reserve(q, 1)
	if ok {
		release(h)
	}
	mu.Unlock()
	if !ok {
		t.Fatalf("port %d not reserved after its lock was dropped", q)
	}

	// A listener.
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
	if err != nil {
		t.Skipf("listen on %d: %v", q, err)
	}
	defer l.Close()
	mu.Lock()
	_, ok = reserve(q, 1)
	mu.Unlock()
	if ok {
		t.Fatalf("port %d reserved while something listens on it", q)
	}
}
