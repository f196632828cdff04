package rls_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestReadyCluster pins /ready's rule for a Redis Cluster (Store.Ping):
// ready while every slot has a master and every master answers PING.
// Replicas are never asked: one down changes nothing (before, /ready was
// one PING to a random node, replicas included, and a dead replica the
// service never uses failed 8 of 200 polls). A dead master makes it not
// ready at once (before: 200 for seconds, while the PING went to other
// nodes), and ready again once its replica has taken over its slots.
func TestReadyCluster(t *testing.T) {
	c := redistest.StartClusterReplicas(t, 3, 1)
	// faultTimeout: the healthy polls must not time out on a loaded
	// machine; a dead master refuses at once whatever the timeout.
	store := newStore(t, c.Addrs(), true, faultTimeout)
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return store.Ping(ctx)
	}
	// Kill a replica of another master than the one killed next, whose
	// own replica must stay to take over.
	var victim *redistest.Server
	for _, r := range c.Replicas {
		role := r.MustDo("ROLE").([]any)
		if role[0] == "slave" && role[2].(int64) != int64(c.Nodes[1].Port) {
			victim = r
			break
		}
	}
	if victim == nil {
		t.Fatal("no replica of a master other than Nodes[1]")
	}
	victim.Kill()
	for i := range 20 {
		if err := ping(); err != nil {
			t.Fatalf("poll %d with a replica down: %v", i, err)
		}
	}
	c.Nodes[1].Kill()
	for i := range 5 {
		if err := ping(); err == nil {
			t.Fatalf("poll %d with a master down: ready", i)
		}
	}
	// Its replica takes over (cluster-node-timeout 3 s, then an election).
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ping()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			nodes, _ := c.Nodes[0].Do("CLUSTER", "NODES")
			t.Fatalf("not ready 30 s after a master with a replica died: %v\n%v", err, nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
