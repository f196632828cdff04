package wasmhost_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestReconfigure: every worker's root context reads the new plugin
// configuration through proxy_on_configure; one the guest refuses is
// reported, naming the workers.
func TestReconfigure(t *testing.T) {
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 2, PluginConfig: []byte("cfg-1")})
	if err := h.Reconfigure([]byte("cfg-2")); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // both workers, round robin
		if got := test(t, srv, "config").header.Get("X-Result"); !strings.HasPrefix(got, "cfg-2,") {
			t.Errorf("request %d: x-result %q, want the new configuration", i, got)
		}
	}
	err := h.Reconfigure([]byte("fail"))
	if err == nil || !strings.Contains(err.Error(), "workers [0 1] refused the configuration") {
		t.Errorf("got %v, want both workers refusing", err)
	}
}

// TestReconfigureNewRoot: a configuration update is a new root context, as
// in Envoy: created with a fresh id (context_create, vm_start, configure);
// new streams are created under it; the old root keeps its held stream and
// its own tick, releases it, and is shut down (on_done, on_delete) once
// that stream has ended. A refused update leaves the current root alone
// and shuts the refused one down.
func TestReconfigureNewRoot(t *testing.T) {
	var mu sync.Mutex
	var calls []wasmhost.Call
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 1, PluginConfig: []byte("cfg-1"), DisableTicks: true,
		Observe: func(c wasmhost.Call) {
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
		}})
	seen := func(name string, guest bool) []wasmhost.Call {
		mu.Lock()
		defer mu.Unlock()
		var out []wasmhost.Call
		for _, c := range calls {
			if c.Name == name && c.Guest == guest {
				out = append(out, c)
			}
		}
		return out
	}
	held := make(chan reply, 1)
	go func() { held <- test(t, srv, "tick-resume") }() // held until root 1 ticks
	waitFor(t, "the held stream", func() bool { return len(h.Roots(0)) == 1 && h.Roots(0)[0].Streams == 1 })
	if err := h.Reconfigure([]byte("cfg-2")); err != nil {
		t.Fatal(err)
	}
	roots := h.Roots(0)
	if len(roots) != 2 || roots[0].ID != 1 || !roots[0].Retired || roots[0].Streams != 1 || roots[0].TickPeriod != 20*time.Millisecond ||
		roots[1].Retired || roots[1].TickPeriod != 0 {
		t.Fatalf("roots after the update: %+v; want root 1 retired with its stream and 20ms tick, and a new current root", roots)
	}
	newID := roots[1].ID
	for _, name := range []string{"proxy_on_context_create", "proxy_on_vm_start", "proxy_on_configure"} {
		cs := seen(name, true)
		if c := cs[len(cs)-1]; c.Context != newID || name == "proxy_on_context_create" && c.Args[1] != 0 {
			t.Errorf("last %s: %+v; want it for the new root %d", name, c, newID)
		}
	}
	if got := test(t, srv, "config").header.Get("X-Result"); !strings.HasPrefix(got, "cfg-2,") {
		t.Errorf("new stream: x-result %q, want the new configuration", got)
	}
	if cs := seen("proxy_on_context_create", true); cs[len(cs)-1].Args[1] != uint64(newID) {
		t.Errorf("the new stream was created under root %d, want %d", cs[len(cs)-1].Args[1], newID)
	}
	if err := h.Tick(); err != nil { // only root 1 has a tick period
		t.Fatal(err)
	}
	if ticks := seen("proxy_on_tick", true); len(ticks) != 1 || ticks[0].Context != 1 {
		t.Errorf("ticks %+v, want one, on root 1", ticks)
	}
	if r := <-held; r.status != 200 || r.header.Get("X-Result") != "ticked" {
		t.Errorf("held request: %d %q, want 200 released by root 1's tick", r.status, r.header.Get("X-Result"))
	}
	var done, deleted []uint32
	for _, c := range seen("proxy_on_done", true) {
		done = append(done, c.Context)
	}
	for _, c := range seen("proxy_on_delete", true) {
		deleted = append(deleted, c.Context)
	}
	if !slices.Contains(done, 1) || !slices.Contains(deleted, 1) {
		t.Errorf("on_done for %v, on_delete for %v: root 1 must be shut down after its last stream", done, deleted)
	}
	if roots := h.Roots(0); len(roots) != 1 || roots[0].ID != newID {
		t.Errorf("roots %+v, want only %d", roots, newID)
	}

	if err := h.Reconfigure([]byte("fail")); err == nil {
		t.Fatal("a refused configuration was applied")
	}
	if roots := h.Roots(0); len(roots) != 1 || roots[0].ID != newID {
		t.Errorf("roots after a refused update: %+v, want only %d", roots, newID)
	}
	if cs := seen("proxy_on_delete", true); cs[len(cs)-1].Context <= newID {
		t.Errorf("the refused root was not deleted: last on_delete %+v", cs[len(cs)-1])
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
