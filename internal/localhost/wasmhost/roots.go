package wasmhost

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Root contexts, as proxy-wasm-cpp-host keeps them in an Envoy worker.
//
// Envoy keys a plugin by its name, root_id and configuration, so a
// configuration update is a new plugin: in every VM it runs in, the new
// plugin gets a root context of its own (WasmBase::start:
// proxy_on_context_create(id, 0) with a fresh context id, then
// proxy_on_vm_start and proxy_on_configure), and new streams are created
// under it. The old plugin's handle lives on in the streams created under
// it (ContextBase::plugin_handle_): its root context stays, with its own
// tick timer (Wasm::setTickPeriod is per root context id), until the last
// of them ends. Then PluginHandleBase's destructor shuts it down
// (WasmBase::startShutdown): proxy_on_done on the old root and, if that
// returns true, proxy_on_delete; if it returns false, once the root calls
// proxy_done.
//
// The host models exactly that: Reconfigure (reload.go) adds a root, every
// stream remembers its root, a retired root keeps ticking while it has
// streams and is shut down after its last stream ends.

// rootCtx is one root context of a worker VM.
type rootCtx struct {
	id uint32

	tickPeriod atomic.Uint32 // milliseconds; 0 = no ticks
	tickSetAt  atomic.Int64  // real unix nanoseconds of the last period change (tickLoop)
	// timerFrom is when its timer last started, on the host's monotonic
	// clock (Options.Nanotime): when the period was set or the last tick
	// ran, as Envoy re-enables the timer after each tick (TickDue).
	timerFrom atomic.Int64

	// retired: a newer configuration took over; shut down once its last
	// stream ends. doneWait: proxy_on_done returned false; deleted once it
	// calls proxy_done (done). Guarded by worker.mu.
	retired, doneWait, done bool
}

// RootInfo describes one root context of a worker (Host.Roots).
type RootInfo struct {
	// ID is the root context's id.
	ID uint32
	// TickPeriod is the tick period it set (0: none).
	TickPeriod time.Duration
	// Retired reports that a newer configuration took over: the root
	// stays while streams created under it live.
	Retired bool
	// Streams is the number of live streams created under it.
	Streams int
}

// resetRoots gives a freshly started VM its one root context. w.mu must be
// held or w not yet shared.
func (w *worker) resetRoots() {
	r := &rootCtx{id: rootContextID}
	w.roots.Store(&[]*rootCtx{r})
	w.curRoot = rootContextID
}

// rootList returns the worker's root contexts, oldest first; the last is
// the current one. Safe without w.mu (the slice is never modified).
func (w *worker) rootList() []*rootCtx {
	if p := w.roots.Load(); p != nil {
		return *p
	}
	return nil
}

// currentRoot returns the root context new streams are created under.
func (w *worker) currentRoot() *rootCtx {
	rs := w.rootList()
	if len(rs) == 0 {
		return nil
	}
	return rs[len(rs)-1]
}

// root returns the root context with id, or nil.
func (w *worker) root(id uint32) *rootCtx {
	for _, r := range w.rootList() {
		if r.id == id {
			return r
		}
	}
	return nil
}

// setRoots replaces the root list. w.mu must be held.
func (w *worker) setRoots(rs []*rootCtx) { w.roots.Store(&rs) }

// streamsOf counts the live streams created under root id. w.mu must be
// held.
func (w *worker) streamsOf(id uint32) int {
	n := 0
	for _, s := range w.streams {
		if s.root == id {
			n++
		}
	}
	return n
}

// endStream forgets a finished stream and shuts down the retired roots it
// was keeping. w.mu must be held.
func (w *worker) endStream(s *stream) {
	delete(w.streams, s.id)
	w.reapRoots()
}

// reapRoots shuts down every retired root context without live streams:
// proxy_on_done and, if it returns true (or once it has called proxy_done),
// proxy_on_delete. w.mu must be held.
func (w *worker) reapRoots() {
	rs := w.rootList()
	var keep []*rootCtx
	changed := false
	for i, r := range rs {
		if i == len(rs)-1 || !r.retired || w.streamsOf(r.id) > 0 {
			keep = append(keep, r)
			continue
		}
		if !r.doneWait {
			ok, err := w.callRoot("proxy_on_done", uint64(r.id))
			if err != nil {
				w.h.hostLog(w, LogCritical, fmt.Sprintf("root context %d: proxy_on_done: %v", r.id, err))
				return // the VM trapped: it restarts with one root
			}
			if uint32(ok) == 0 && !r.done {
				r.doneWait = true
				keep = append(keep, r)
				continue
			}
		} else if !r.done {
			keep = append(keep, r)
			continue
		}
		if _, err := w.callRoot("proxy_on_delete", uint64(r.id)); err != nil {
			w.h.hostLog(w, LogCritical, fmt.Sprintf("root context %d: proxy_on_delete: %v", r.id, err))
			return
		}
		changed = true
	}
	if changed {
		w.setRoots(keep)
	}
}

// Roots describes worker i's root contexts, oldest first; the last is the
// one new streams are created under.
func (h *Host) Roots(i int) []RootInfo {
	w := h.workers[i]
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []RootInfo
	for _, r := range w.rootList() {
		out = append(out, RootInfo{ID: r.id, TickPeriod: time.Duration(r.tickPeriod.Load()) * time.Millisecond,
			Retired: r.retired, Streams: w.streamsOf(r.id)})
	}
	return out
}

// TickDue runs proxy_on_tick on every root context whose timer is due on
// the host's monotonic clock (Options.Nanotime, e.g. a FakeClock), the way
// Envoy's per-root timer fires: one period after the period was last set
// or the last tick ran. It returns how many ticks ran. With a FakeClock
// and DisableTicks, a test moves the clock and calls TickDue to get the
// ticks Envoy would have run, and no others.
func (h *Host) TickDue() (int, error) {
	n := 0
	var errs []error
	for _, w := range h.workers {
		for _, r := range w.rootList() {
			p := int64(r.tickPeriod.Load()) * int64(time.Millisecond)
			if p == 0 || h.monoNow()-r.timerFrom.Load() < p {
				continue
			}
			if err := w.tickRoot(r.id); err != nil {
				errs = append(errs, err)
			}
			n++
		}
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("host: TickDue: %v", errs)
	}
	return n, nil
}

// processStart anchors the real monotonic clock.
var processStart = time.Now()

// monoNow is the host's monotonic clock in nanoseconds: Options.Nanotime
// if set.
func (h *Host) monoNow() int64 {
	if h.opts.Nanotime != nil {
		return h.opts.Nanotime()
	}
	return int64(time.Since(processStart))
}

// tickRoot runs proxy_on_tick on root id, if it still exists, and restarts
// its timer as Envoy's tickHandler does; then shuts down retired roots a
// tick may have finished with.
func (w *worker) tickRoot(id uint32) error {
	if err := w.acquire(); err != nil {
		return err
	}
	defer w.mu.Unlock()
	r := w.root(id)
	if r == nil {
		return nil
	}
	_, err := w.callRoot("proxy_on_tick", uint64(id))
	if err != nil {
		return err
	}
	r.timerFrom.Store(w.h.monoNow())
	w.reapRoots()
	return nil
}
