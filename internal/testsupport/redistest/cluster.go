package redistest

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of masters without replicas on 127.0.0.1,
// created with `redis-cli --cluster create`. Nodes are started with
// cluster-require-full-coverage no, so killing one master fails only the
// slots it owns: the other masters keep answering for theirs.
type Cluster struct {
	// Nodes are the masters, in the order given to redis-cli (which assigns
	// them the slot ranges in that order).
	Nodes []*Server
	// Replicas are the replicas (StartClusterReplicas), each of a master
	// redis-cli chose.
	Replicas []*Server
	t        testing.TB
}

// StartCluster starts masters (at least 3, as redis-cli requires) cluster
// nodes, joins them into one cluster covering all 16384 slots, and waits
// until every node reports cluster_state:ok and knows every other. The
// nodes are stopped when the test ends.
func StartCluster(t testing.TB, masters int, extra ...string) *Cluster {
	t.Helper()
	return StartClusterReplicas(t, masters, 0, extra...)
}

// StartClusterReplicas is StartCluster with replicas replicas per master
// (in Replicas), which take over a master that fails (after the nodes'
// cluster-node-timeout, 3 s).
func StartClusterReplicas(t testing.TB, masters, replicas int, extra ...string) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, not %d", masters)
	}
	bin, cli := Require(t, true)
	c := &Cluster{t: t}
	for i := range masters * (1 + replicas) {
		s := newServer(t, bin, true, extra)
		s.start()
		if i < masters {
			c.Nodes = append(c.Nodes, s)
		} else {
			c.Replicas = append(c.Replicas, s)
		}
	}
	all := append(append([]*Server{}, c.Nodes...), c.Replicas...)
	for _, s := range all {
		s.waitPing()
	}
	args := []string{"--cluster", "create"}
	for _, s := range all {
		args = append(args, s.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	cmd := exec.Command(cli, args...)
	out, err := runBounded(cmd, readyTimeout)
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, s := range all {
		s.waitClusterOK(len(all))
	}
	// A replica that has not synchronized with its master once would not
	// take over from it.
	for _, s := range c.Replicas {
		s.waitReplicaSynced()
	}
	return c
}

// waitReplicaSynced waits until the replica's link to its master is up.
func (s *Server) waitReplicaSynced() {
	s.t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		v, err := s.Do("INFO", "replication")
		if str, _ := v.(string); err == nil && strings.Contains(str, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: replica %s not synchronized within %v: %v %v", s.Addr, readyTimeout, v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Addrs returns the nodes' "127.0.0.1:port" addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr
	}
	return out
}

// Slot returns the hash slot of key, as CLUSTER KEYSLOT computes it on a
// running node.
func (c *Cluster) Slot(key string) int {
	c.t.Helper()
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		v, err := s.Do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			c.t.Fatalf("redistest: CLUSTER KEYSLOT %q: %v", key, err)
		}
		return int(v.(int64))
	}
	c.t.Fatal("redistest: no running node to ask CLUSTER KEYSLOT")
	return -1
}

// NodeFor returns the index in Nodes of the master that owns key's slot,
// from CLUSTER SLOTS as a running node sees it.
func (c *Cluster) NodeFor(key string) int {
	c.t.Helper()
	slot := c.Slot(key)
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		v, err := s.Do("CLUSTER", "SLOTS")
		if err != nil {
			c.t.Fatalf("redistest: CLUSTER SLOTS: %v", err)
		}
		for _, r := range v.([]any) {
			rng := r.([]any)
			lo, hi := int(rng[0].(int64)), int(rng[1].(int64))
			if slot < lo || slot > hi {
				continue
			}
			port := int(rng[2].([]any)[1].(int64))
			for i, n := range c.Nodes {
				if n.Port == port {
					return i
				}
			}
		}
		break
	}
	c.t.Fatalf("redistest: no node owns slot %d of %q", slot, key)
	return -1
}

// waitClusterOK waits until the node reports cluster_state:ok with all slots
// assigned and (when known > 0) that many nodes known.
func (s *Server) waitClusterOK(known int) {
	s.t.Helper()
	deadline := time.Now().Add(readyTimeout)
	var last string
	for {
		v, err := s.Do("CLUSTER", "INFO")
		if err == nil {
			last, _ = v.(string)
			info := clusterInfo(last)
			if info["cluster_state"] == "ok" && info["cluster_slots_assigned"] == "16384" &&
				(known == 0 || info["cluster_known_nodes"] == strconv.Itoa(known)) {
				return
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: %s: cluster not ok within %v; last CLUSTER INFO:\n%s", s.Addr, readyTimeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func clusterInfo(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			m[k] = v
		}
	}
	return m
}

// runBounded runs cmd and kills it if it takes longer than d.
func runBounded(cmd *exec.Cmd, d time.Duration) ([]byte, error) {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return []byte(out.String()), err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return []byte(out.String()), fmt.Errorf("timed out after %v", d)
	}
}
