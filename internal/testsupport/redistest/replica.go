package redistest

import (
	"strconv"
	"strings"
	"testing"
)

// StartReplica starts one redis-server replicating master (REPLICAOF, with
// master's password as masterauth and its own requirepass, when master has
// one), and waits until its link to master is up. It is stopped when the
// test ends. Start a Sentinel (StartSentinel) after its replicas: the
// Sentinel learns them from the master's first INFO.
func StartReplica(t testing.TB, master *Server, extra ...string) *Server {
	t.Helper()
	args := []string{"--replicaof", "127.0.0.1", strconv.Itoa(master.Port)}
	if master.password != "" {
		args = append(args, "--masterauth", master.password, "--requirepass", master.password)
	}
	s := Start(t, append(args, extra...)...)
	s.waitReplicaSynced()
	return s
}

// WaitCaughtUp waits until replica has applied everything master has
// written so far: its replication offset has reached master's.
func (s *Server) WaitCaughtUp(master *Server) {
	s.t.Helper()
	want := infoField(master.MustDo("INFO", "replication"), "master_repl_offset")
	waitFor(s.t, func() (bool, any) {
		v, err := s.Do("INFO", "replication")
		if err != nil {
			return false, err
		}
		got := infoField(v, "slave_repl_offset")
		return got >= want && want >= 0, "replica offset " + strconv.FormatInt(got, 10) + ", master " + strconv.FormatInt(want, 10)
	})
}

// WaitSentinelReplicas waits until the Sentinel s knows n replicas of the
// master set name (a failover needs one it knows).
func (s *Server) WaitSentinelReplicas(name string, n int) {
	s.t.Helper()
	waitFor(s.t, func() (bool, any) {
		v, err := s.Do("SENTINEL", "REPLICAS", name)
		a, _ := v.([]any)
		return err == nil && len(a) == n, v
	})
}

// WaitSentinelMaster waits until the Sentinel s names master as the
// master of set name (after a failover: the replica it promoted).
func (s *Server) WaitSentinelMaster(name string, master *Server) {
	s.t.Helper()
	waitFor(s.t, func() (bool, any) {
		v, err := s.Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
		a, _ := v.([]any)
		return err == nil && len(a) == 2 && a[0] == "127.0.0.1" && a[1] == strconv.Itoa(master.Port), v
	})
}

// Role returns the first field of ROLE: "master", "slave" or "sentinel".
func (s *Server) Role() string {
	s.t.Helper()
	v, err := s.Do("ROLE")
	if a, ok := v.([]any); err == nil && ok && len(a) > 0 {
		r, _ := a[0].(string)
		return r
	}
	return ""
}

// infoField returns the integer field name of an INFO reply, -1 when it
// has none.
func infoField(info any, name string) int64 {
	text, _ := info.(string)
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == name {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}
