package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Freeze stops p with SIGSTOP and returns once every thread of it is
// stopped, so that from then on it certainly answers nothing: a peer
// slower than any timeout, for as long as the test wants, however slow
// the machine. SIGSTOP alone is not enough: kill(2) returns before the
// signal is handled, and on a loaded machine the process can go on
// running (and answering) for a while; Thaw resumes it.
//
// The wait is bounded by readyTimeout; on Linux it reads each thread's
// state in /proc, elsewhere ps(1).
func Freeze(p *os.Process) error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		stopped, err := allStopped(p.Pid)
		if err != nil {
			return err
		}
		if stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped %v after SIGSTOP", p.Pid, readyTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// Thaw resumes a process stopped by Freeze. SIGCONT, unlike SIGSTOP, takes
// effect within kill(2): every thread is runnable when it returns.
func Thaw(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// allStopped reports whether every thread of process pid is stopped.
func allStopped(pid int) (bool, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		if _, statErr := os.Stat("/proc/self/stat"); statErr == nil {
			return false, fmt.Errorf("process %d: no threads in /proc (exited?)", pid)
		}
		// No /proc (macOS, the BSDs): ps shows the process's state, "T"
		// once it is stopped as a whole.
		out, err := exec.Command("ps", "-o", "state=", "-p", fmt.Sprint(pid)).Output()
		if err != nil {
			return false, fmt.Errorf("ps -p %d: %w", pid, err)
		}
		return strings.HasPrefix(strings.TrimSpace(string(out)), "T"), nil
	}
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if errors.Is(err, os.ErrNotExist) {
			continue // a thread that exited
		}
		if err != nil {
			return false, err
		}
		// "pid (comm) S ...": the state follows the last ')', as comm
		// may hold anything.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			return false, fmt.Errorf("%s: %q", task, s)
		}
		switch s[i+2] {
		case 'T', 't', 'Z', 'X': // stopped, or a thread gone
		default:
			return false, nil
		}
	}
	return true, nil
}

// Freeze stops the server (SIGSTOP) and returns once it is certainly
// stopped: it accepts connections (the kernel does) but answers nothing
// until Thaw, a Redis slower than any timeout for exactly as long as the
// test wants.
func (s *Server) Freeze() {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		s.t.Fatalf("redistest: Freeze: %s is not running", s.Addr)
	}
	if err := Freeze(cmd.Process); err != nil {
		s.t.Fatalf("redistest: Freeze %s: %v", s.Addr, err)
	}
}

// Thaw resumes a frozen server; it does nothing when the server is not
// running.
func (s *Server) Thaw() {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil {
		_ = Thaw(cmd.Process)
	}
}
