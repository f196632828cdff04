package redistest

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill redis-server if the test process dies
// without running its cleanups (a panic, a timeout, SIGKILL).
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
