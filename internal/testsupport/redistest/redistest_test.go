package redistest_test

import (
	"fmt"
	"testing"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

func TestServerKillRestart(t *testing.T) {
	s := redistest.Start(t)
	if got := s.MustDo("SET", "k", "v"); got != "OK" {
		t.Fatalf("SET: got %v, want OK", got)
	}
	if got := s.MustDo("GET", "k"); got != "v" {
		t.Fatalf("GET: got %v, want v", got)
	}
	s.Kill()
	if s.Running() {
		t.Fatal("Running after Kill")
	}
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Restart()
	// No persistence: the key is gone.
	if got := s.MustDo("GET", "k"); got != nil {
		t.Fatalf("GET after restart: got %v, want nil", got)
	}
	if _, err := s.Do("NOSUCHCOMMAND"); err == nil {
		t.Fatal("an unknown command gave no error reply")
	}
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	owners := map[int]int{}
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		n := c.NodeFor(key)
		owners[n]++
		if got := c.Nodes[n].MustDo("SET", key, "v"); got != "OK" {
			t.Fatalf("SET %s on its owner: got %v", key, got)
		}
		other := c.Nodes[(n+1)%3]
		if _, err := other.Do("GET", key); err == nil {
			t.Fatalf("GET %s on a node that does not own it: no MOVED error", key)
		}
	}
	if len(owners) != 3 {
		t.Fatalf("30 keys on %d masters, want all 3: %v", len(owners), owners)
	}

	// Killing one master leaves the others serving their slots.
	c.Nodes[0].Kill()
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		n := c.NodeFor(key)
		if n == 0 {
			continue
		}
		if got := c.Nodes[n].MustDo("GET", key); got != "v" {
			t.Fatalf("GET %s with master 0 down: got %v", key, got)
		}
	}
	c.Nodes[0].Restart()
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		if c.NodeFor(key) == 0 {
			if got := c.Nodes[0].MustDo("SET", key, "w"); got != "OK" {
				t.Fatalf("SET %s after restart: got %v", key, got)
			}
		}
	}
}
