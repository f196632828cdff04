package redistest_test

import (
	"testing"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestReplicaSentinel: a replica has what its master wrote once it has
// caught up; a Sentinel started after it knows it, and names the replica
// as the master once it has promoted it (the master killed).
func TestReplicaSentinel(t *testing.T) {
	master := redistest.Start(t, "--requirepass", "pw")
	replica := redistest.StartReplica(t, master)
	if got := replica.Role(); got != "slave" {
		t.Fatalf("replica's ROLE: %q, want slave", got)
	}
	master.MustDo("SET", "k", "v")
	replica.WaitCaughtUp(master)
	if got := replica.MustDo("GET", "k"); got != "v" {
		t.Fatalf("GET k on the replica after WaitCaughtUp: %v, want v", got)
	}
	sentinel := redistest.StartSentinel(t, "set", master)
	sentinel.WaitSentinelReplicas("set", 1)
	master.Kill()
	sentinel.WaitSentinelMaster("set", replica)
	if got := replica.Role(); got != "master" {
		t.Fatalf("promoted replica's ROLE: %q, want master", got)
	}
}
