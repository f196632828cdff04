package wasmhost

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
)

// workerKey carries the calling worker in the context passed to every call
// into the guest, so host functions know which VM called them.
type workerKey struct{}

// rootContextID is the root context's ID in every VM; proxy-wasm-cpp-host
// allocates it first.
const rootContextID = 1

// worker is one VM instance, like the Wasm VM of one Envoy worker thread.
// mu is held for the duration of every call into the guest: a wazero module
// instance runs one call at a time.
type worker struct {
	h     *Host
	index int

	mu      sync.Mutex
	closed  bool
	failed  error // set when a guest call trapped; the VM is restarted
	ctx     context.Context
	mod     api.Module
	fns     map[string]api.Function
	alloc   api.Function
	nextID  uint32
	streams map[uint32]*stream
	cur     *stream // stream whose callback is running; nil for root calls
	curID   atomic.Uint32

	rootProps map[string][]byte // proxy_set_property from root callbacks

	metricIDs    map[uint32]*metric
	nextMetricID [3]uint32

	// roots are the VM's root contexts, oldest first, the last the one new
	// streams are created under (roots.go); curRoot is the root of the
	// running callback (the stream's, or the root called), which
	// proxy_set_tick_period_milliseconds and callouts act for.
	roots   atomic.Pointer[[]*rootCtx]
	curRoot uint32

	callouts calloutState
	warned   map[string]bool // unimplemented functions already logged

	calls      []uint64          // host calls by importNames index; see Host.HostCalls
	guestCalls map[string]uint64 // guest exports called, by name; see Host.GuestCalls
	hostNanos  int64             // time in host functions, with Options.TimeHostCalls

	starting  bool
	startErrs []string // error-level lines logged while starting
}

// start instantiates the module and runs the plugin start sequence. w.mu
// must be held or w not yet shared.
func (w *worker) start() error {
	h := w.h
	name := fmt.Sprintf("%s-worker%d-%d", h.opts.PluginName, w.index, h.modSeq.Add(1))
	cfg := wazero.NewModuleConfig().
		WithName(name).
		WithStartFunctions(). // a reactor: _initialize is called below
		WithStdout(&lineWriter{h: h, w: w, level: LogInfo, name: "stdout"}).
		WithStderr(&lineWriter{h: h, w: w, level: LogError, name: "stderr"}).
		WithRandSource(randReader).
		WithSysNanosleep()
	if h.opts.Walltime != nil {
		cfg = cfg.WithWalltime(h.opts.Walltime, 1)
	} else {
		cfg = cfg.WithSysWalltime()
	}
	if h.opts.Nanotime != nil {
		cfg = cfg.WithNanotime(h.opts.Nanotime, 1)
	} else {
		cfg = cfg.WithSysNanotime()
	}
	w.ctx = context.WithValue(context.Background(), workerKey{}, w)
	w.fns = make(map[string]api.Function)
	w.dropCallouts()
	w.wakeAll() // streams paused in the old VM cannot be resumed
	w.streams = make(map[uint32]*stream)
	w.metricIDs = make(map[uint32]*metric)
	w.nextMetricID = [3]uint32{uint32(MetricCounter), uint32(MetricGauge), uint32(MetricHistogram)}
	w.nextID = rootContextID + 1
	w.failed = nil
	w.rootProps = nil
	w.resetRoots()

	mod, err := h.rt.InstantiateModule(w.ctx, h.compiled, cfg)
	if err != nil {
		return fmt.Errorf("host: worker %d: instantiate: %w", w.index, err)
	}
	w.mod = mod
	for name := range guestExports {
		if f := mod.ExportedFunction(name); f != nil {
			w.fns[name] = f
		}
	}
	w.alloc = w.fns[h.allocFn]

	w.starting, w.startErrs = true, nil
	defer func() { w.starting = false }()
	fail := func(what string) error {
		said := "the filter logged no error"
		if len(w.startErrs) > 0 {
			said = "the filter said: " + strings.Join(w.startErrs, "; ")
		}
		_ = mod.Close(w.ctx)
		return fmt.Errorf("host: worker %d: %s (%s)", w.index, what, said)
	}
	if _, err := w.call("_initialize"); err != nil {
		return fail("_initialize: " + err.Error())
	}
	if _, err := w.call("proxy_on_context_create", rootContextID, 0); err != nil {
		return fail("proxy_on_context_create(root): " + err.Error())
	}
	if w.fns["proxy_on_vm_start"] != nil {
		ok, err := w.call("proxy_on_vm_start", rootContextID, uint64(len(h.opts.VMConfig)))
		if err != nil {
			return fail("proxy_on_vm_start: " + err.Error())
		}
		if uint32(ok) == 0 {
			return fail(fmt.Sprintf("plugin %q: proxy_on_vm_start returned false", h.opts.PluginName))
		}
	}
	if w.fns["proxy_on_configure"] != nil {
		ok, err := w.call("proxy_on_configure", rootContextID, uint64(len(h.opts.PluginConfig)))
		if err != nil {
			return fail("proxy_on_configure: " + err.Error())
		}
		if uint32(ok) == 0 {
			return fail(fmt.Sprintf("plugin %q rejected its configuration: proxy_on_configure returned false", h.opts.PluginName))
		}
	}
	return nil
}

// acquire locks the worker and makes sure its VM is usable, restarting it
// after a trap (Envoy's FAIL_RELOAD). On error the worker is unlocked.
func (w *worker) acquire() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return errors.New("host is closed")
	}
	if w.failed == nil {
		return nil
	}
	w.h.hostLog(w, LogWarn, fmt.Sprintf("restarting worker %d after: %v", w.index, w.failed))
	_ = w.mod.Close(w.ctx)
	if err := w.start(); err != nil {
		w.failed = err
		w.mu.Unlock()
		return err
	}
	return nil
}

// call calls the named export if the module has it; a missing export is a
// no-op returning 0. A trap marks the worker failed. w.mu must be held.
func (w *worker) call(name string, args ...uint64) (uint64, error) {
	f := w.fns[name]
	if f == nil {
		return 0, nil
	}
	w.observeGuest(name, args)
	if w.guestCalls == nil {
		w.guestCalls = make(map[string]uint64)
	}
	w.guestCalls[name]++
	res, err := f.Call(w.ctx, args...)
	if err != nil {
		w.failed = fmt.Errorf("%s: %w", name, err)
		return 0, err
	}
	if len(res) == 0 {
		return 0, nil
	}
	return res[0], nil
}

// callStream runs a stream callback with s as the current stream.
func (w *worker) callStream(s *stream, p phase, name string, args ...uint64) (uint64, error) {
	w.cur = s
	w.curID.Store(s.id)
	w.curRoot = s.root
	s.phase = p
	defer func() {
		w.cur = nil
		w.curID.Store(0)
	}()
	return w.call(name, args...)
}

// callRoot calls a root-context callback (tick, callout reports) on the
// root context args[0]: no stream is current unless the guest makes one
// effective, and none stays current afterwards.
func (w *worker) callRoot(name string, args ...uint64) (uint64, error) {
	w.cur = nil
	w.curID.Store(0)
	w.curRoot = uint32(args[0])
	defer func() {
		w.cur = nil
		w.curID.Store(0)
	}()
	return w.call(name, args...)
}

// wake tells the request goroutine of a paused stream to look again
// (continued, local reply, reset, or the VM is gone).
func (s *stream) wakeUp() {
	if s.wake != nil {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// wakeAll wakes every paused stream of the worker. w.mu must be held.
func (w *worker) wakeAll() {
	for _, s := range w.streams {
		s.wakeUp()
	}
}

// allocate returns guest memory of size n from the guest's allocator.
func (w *worker) allocate(ctx context.Context, n uint32) (uint32, bool) {
	if w.alloc == nil {
		return 0, false
	}
	res, err := w.alloc.Call(ctx, uint64(n))
	if err != nil {
		w.failed = fmt.Errorf("%s: %w", w.h.allocFn, err)
		return 0, false
	}
	ptr := uint32(res[0])
	if ptr == 0 {
		return 0, false
	}
	return ptr, true
}

// newStream registers s as a new stream context, under the current root
// context.
func (w *worker) newStream(s *stream) {
	s.id = w.nextID
	w.nextID++
	s.root = w.currentRoot().id
	w.streams[s.id] = s
}
