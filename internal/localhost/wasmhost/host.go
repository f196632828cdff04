// Package wasmhost is a proxy-wasm ABI 0.2.1 host on wazero that runs the
// tokengate filter the way Envoy does, for local runs (tokengate-local) and
// end-to-end tests.
//
// A Host compiles the module once (through a process-wide wazero
// compilation cache), instantiates it once per worker, like Envoy's worker
// threads, and starts each instance in proxy-wasm-cpp-host's order:
// _initialize, proxy_on_context_create(root, 0), proxy_on_vm_start,
// proxy_on_configure. Each request is a stream context (Stream) on one
// worker, with the request and response headers, local replies,
// properties, shared data and metrics behaving as in Envoy. Shared data
// lives in one SharedData shared by every worker, as Envoy shares one
// store per vm_id across threads.
//
// This package is the proxy-wasm ABI only: it serves no HTTP. The HTTP
// side, Envoy's connection manager, jwt_authn, the upstream and the
// admin's Prometheus text, is internal/localhost/proxy, which drives
// Streams and depends on this package, never the other way. A test
// typically does:
//
//	h, err := wasmhost.New(ctx, wasmhost.Options{Wasm: wasm, PluginConfig: cfg})
//	if err != nil { ... }
//	defer h.Close(ctx)
//	srv := httptest.NewServer(proxy.New(h, proxy.Options{}))
//	defer srv.Close()
//	resp, err := http.Get(srv.URL + "/")
package wasmhost

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

// compilationCache is shared by every Host in the process, so a module is
// compiled to machine code once however many hosts and workers run it.
var compilationCache = wazero.NewCompilationCache()

// Options configures a Host. Only Wasm is required.
type Options struct {
	// Wasm is the guest module, e.g. the contents of build/tokengate.wasm.
	Wasm []byte
	// PluginConfig is what proxy_on_configure reads as
	// PLUGIN_CONFIGURATION: Envoy's `configuration`, unwrapped.
	PluginConfig []byte
	// VMConfig is what proxy_on_vm_start reads as VM_CONFIGURATION:
	// Envoy's `vm_config.configuration`, unwrapped.
	VMConfig []byte
	// PluginName, RootID and VMID are the plugin_name, plugin_root_id and
	// plugin_vm_id properties. PluginName defaults to "tokengate".
	PluginName, RootID, VMID string

	// Workers is the number of VM instances, like Envoy's --concurrency.
	// Zero means runtime.NumCPU(), at least 2.
	Workers int

	// Store is the shared data shared by all workers. Nil means
	// NewSharedData(Kong). Wrap it in a FaultData to inject failures; see
	// CASStorm and FailingData.
	Store SharedData
	// Kong selects Kong ngx_wasm_module behaviour instead of Envoy's: the
	// default store has Kong's CAS semantics, proxy_set_shared_data with a
	// NULL value pointer deletes the key, source.address has no port and
	// integer properties are decimal strings.
	Kong bool
	// Walltime and Nanotime are the guest's WASI clocks (wazero's
	// WithWalltime and WithNanotime). Nil means the real clock. Use a
	// FakeClock to move time in tests without sleeping.
	Walltime sys.Walltime
	Nanotime sys.Nanotime

	// LogSink receives every log line at or above MinLogLevel: the filter's
	// proxy_log messages as sent, and the host's own messages prefixed
	// "host: ". Nil prints "[level] message" to stderr. It may be called
	// from several goroutines at once.
	LogSink func(level LogLevel, msg string)
	// MinLogLevel drops lines below it (Envoy's default is info). The zero
	// value, LogTrace, keeps everything.
	MinLogLevel LogLevel
	// MaxLogs bounds how many lines Logs keeps (the most recent). Zero
	// means 10000.
	MaxLogs int

	// Clusters are the upstreams proxy_http_call and proxy_grpc_call can
	// reach, by Envoy cluster name (e.g. the STATIC clusters of envoy.yaml).
	// A call to another name fails as in Envoy.
	Clusters map[string]Cluster
	// AllowPollOneoff gives the guest wazero's working WASI poll_oneoff.
	// By default the host answers ENOSYS, as Envoy 1.33–1.38 does, so a
	// guest whose Go runtime needs timers fails here as it would in Envoy
	// (golang/go#78513).
	AllowPollOneoff bool
	// DisableTicks stops the host from calling proxy_on_tick on its own
	// after the filter sets a tick period; Tick still works.
	DisableTicks bool
	// TimeHostCalls makes the host measure the time spent inside host
	// functions (ExchangeResult.HostNanos), for benchmarks; it costs two
	// clock reads per host call.
	TimeHostCalls bool

	// Observe, if set, sees every callback into the guest and every host
	// function call (trace.go), in order, with the worker locked: it must
	// not call back into the Host.
	Observe func(Call)
	// Fault, if set, is asked before every host function runs; if it
	// returns true, the function does not run and the guest gets the
	// Status it returned: a host that refuses a call (a tick period
	// answered UNIMPLEMENTED, a context id proxy_set_effective_context
	// does not know). Called with the worker locked.
	Fault func(Call) (Status, bool)
}

// LogEntry is one log line kept by a Host.
type LogEntry struct {
	// Level is the proxy_log level, or the host's level for its own lines.
	Level LogLevel
	// Message is the text as logged, without the "host: " prefix.
	Message string
	// Host reports whether the host, not the filter, wrote the line.
	Host bool
	// Worker is the index of the worker VM, or -1 for host-wide lines.
	Worker int
	// Context is the context ID of the running callback, 0 if none.
	Context uint32
}

// String formats the entry as the default sink prints it.
func (e LogEntry) String() string {
	if e.Host {
		return "[" + e.Level.String() + "] host: " + e.Message
	}
	return "[" + e.Level.String() + "] " + e.Message
}

// Host runs one plugin in N worker VMs. It is safe for concurrent use.
type Host struct {
	opts  Options
	store SharedData

	rt       wazero.Runtime
	compiled wazero.CompiledModule
	allocFn  string // "malloc" or "proxy_on_memory_allocate"

	workers []*worker
	next    atomic.Uint32
	modSeq  atomic.Uint64

	metrics *registry
	// strayContinues counts proxy_continue_stream calls on a stream that is
	// gone or already continued (StrayContinues).
	strayContinues atomic.Uint64

	logMu   sync.Mutex
	logs    []LogEntry // ring of at most opts.MaxLogs
	logHead int        // index of the oldest entry once the ring is full

	closeOnce sync.Once
	stopTicks chan struct{}
	tickDone  sync.WaitGroup

	calloutGroup
}

// New compiles opts.Wasm, checks its imports and exports, and starts
// opts.Workers VMs. It fails if the module imports a function the host
// lacks, or if proxy_on_vm_start or proxy_on_configure returns false; the
// error then quotes the filter's error-level log lines.
func New(ctx context.Context, opts Options) (*Host, error) {
	if len(opts.Wasm) == 0 {
		return nil, errors.New("host: Options.Wasm is empty")
	}
	if opts.Workers < 0 {
		return nil, fmt.Errorf("host: Options.Workers: must be >= 0, got %d", opts.Workers)
	}
	if opts.Workers == 0 {
		opts.Workers = max(runtime.NumCPU(), 2)
	}
	if opts.PluginName == "" {
		opts.PluginName = "tokengate"
	}
	if opts.MaxLogs <= 0 {
		opts.MaxLogs = 10000
	}
	if opts.LogSink == nil {
		opts.LogSink = stderrSink
	}
	h := &Host{
		opts:      opts,
		store:     opts.Store,
		metrics:   newRegistry(),
		stopTicks: make(chan struct{}),
	}
	h.calloutCtx, h.stopCallouts = context.WithCancel(context.Background())
	if h.store == nil {
		h.store = NewSharedData(opts.Kong)
	} else if md, ok := Unwrap(h.store); ok && md.Kong() != opts.Kong {
		return nil, fmt.Errorf("host: Options.Store has %s semantics but the host runs in %s mode", semName(md.Kong()), semName(opts.Kong))
	}

	cfg := wazero.NewRuntimeConfig().WithCompilationCache(compilationCache)
	h.rt = wazero.NewRuntimeWithConfig(ctx, cfg)
	if err := h.start(ctx); err != nil {
		_ = h.rt.Close(ctx)
		return nil, err
	}
	if !opts.DisableTicks {
		h.tickDone.Add(1)
		go h.tickLoop()
	}
	return h, nil
}

func (h *Host) start(ctx context.Context) error {
	if err := h.instantiateWASI(ctx); err != nil {
		return fmt.Errorf("host: wasi: %w", err)
	}
	if err := h.instantiateEnv(ctx); err != nil {
		return fmt.Errorf("host: env module: %w", err)
	}
	compiled, err := h.rt.CompileModule(ctx, h.opts.Wasm)
	if err != nil {
		return fmt.Errorf("host: compile: %w", err)
	}
	h.compiled = compiled
	var imports []importedFunc
	for _, def := range compiled.ImportedFunctions() {
		mod, name, _ := def.Import()
		imports = append(imports, importedFunc{module: mod, name: name, params: def.ParamTypes(), results: def.ResultTypes()})
	}
	if err := checkImports(imports); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	exports := compiled.ExportedFunctions()
	if err := checkExports(exports); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	// Like proxy-wasm-cpp-host and ngx_wasm_module, prefer malloc.
	h.allocFn = "proxy_on_memory_allocate"
	if _, ok := exports["malloc"]; ok {
		h.allocFn = "malloc"
	}
	h.workers = make([]*worker, h.opts.Workers)
	for i := range h.workers {
		w := &worker{h: h, index: i}
		h.workers[i] = w
		if err := w.start(); err != nil {
			return err
		}
	}
	return nil
}

// instantiateWASI provides wasi_snapshot_preview1, with poll_oneoff
// answering ENOSYS unless AllowPollOneoff is set.
func (h *Host) instantiateWASI(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	if !h.opts.AllowPollOneoff {
		const enosys = 52 // WASI errno ENOSYS
		b.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
				w, _ := ctx.Value(workerKey{}).(*worker)
				h.hostLog(w, LogError, "guest called WASI poll_oneoff; answering ENOSYS as Envoy 1.33-1.38 does "+
					"(the Go runtime aborts on it: avoid timers, sleeps and blocking I/O in the filter)")
				stack[0] = enosys
			}), []api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}).
			WithParameterNames("in", "out", "nsubscriptions", "result.nevents").
			Export("poll_oneoff")
	}
	_, err := b.Instantiate(ctx)
	return err
}

// Close stops the ticker and closes every VM. It is safe to call twice.
func (h *Host) Close(ctx context.Context) error {
	var err error
	h.closeOnce.Do(func() {
		close(h.stopTicks)
		h.tickDone.Wait()
		h.stopCallouts()
		for _, w := range h.workers {
			if w == nil {
				continue
			}
			w.mu.Lock()
			w.closed = true
			w.dropCallouts()
			w.wakeAll()
			w.mu.Unlock()
		}
		h.calloutsWG.Wait()
		err = h.rt.Close(ctx)
	})
	return err
}

// Store returns the shared-data store the workers share.
func (h *Host) Store() SharedData { return h.store }

func semName(kong bool) string {
	if kong {
		return "kong"
	}
	return "envoy"
}

// Workers returns the number of worker VMs.
func (h *Host) Workers() int { return len(h.workers) }

// Metric returns the value of the metric the filter defined as name (for a
// histogram, its count) and whether it exists.
func (h *Host) Metric(name string) (uint64, bool) {
	m, ok := h.metrics.get(name)
	if !ok {
		return 0, false
	}
	return m.value.Load(), true
}

// StrayContinues returns how many proxy_continue_stream calls found no
// stream to continue (none effective: the guest's
// proxy_set_effective_context failed, as for a stream that is gone, or was
// not called) or a request already continued. Envoy has no such stream to
// resume, or resumes one twice; a correct filter makes none, and tests
// assert zero.
func (h *Host) StrayContinues() uint64 { return h.strayContinues.Load() }

// InFlight returns the streams the workers hold (from
// proxy_on_context_create to proxy_on_delete) and the callouts not yet
// reported. A callout leaves the count in the same locked section that
// reports it to the guest, so once it is 0 every report has run.
func (h *Host) InFlight() (streams, callouts int) {
	for _, w := range h.workers {
		if w == nil {
			continue
		}
		w.mu.Lock()
		streams += len(w.streams)
		callouts += len(w.callouts.pending)
		w.mu.Unlock()
	}
	return streams, callouts
}

// Metrics returns a snapshot of every metric, sorted by name.
func (h *Host) Metrics() []Metric { return h.metrics.snapshot() }

// Logs returns the kept log lines, oldest first.
func (h *Host) Logs() []LogEntry {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	out := make([]LogEntry, 0, len(h.logs))
	out = append(out, h.logs[h.logHead:]...)
	return append(out, h.logs[:h.logHead]...)
}

// TickPeriod returns the tick period the filter set on worker i (0 if
// none): the shortest among its root contexts (see Roots).
func (h *Host) TickPeriod(i int) time.Duration {
	var p uint32
	for _, r := range h.workers[i].rootList() {
		if t := r.tickPeriod.Load(); t != 0 && (p == 0 || t < p) {
			p = t
		}
	}
	return time.Duration(p) * time.Millisecond
}

// Tick calls proxy_on_tick on every root context, of every worker, that set
// a tick period, now, regardless of the period (TickDue follows it).
func (h *Host) Tick() error {
	var errs []error
	for _, w := range h.workers {
		for _, r := range w.rootList() {
			if r.tickPeriod.Load() == 0 {
				continue
			}
			if err := w.tickRoot(r.id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (h *Host) tickLoop() {
	defer h.tickDone.Done()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	last := map[*rootCtx]time.Time{} // one timer per root context
	for {
		select {
		case <-h.stopTicks:
			return
		case now := <-t.C:
			for _, w := range h.workers {
				for _, r := range w.rootList() {
					p := time.Duration(r.tickPeriod.Load()) * time.Millisecond
					from := last[r]
					if set := time.Unix(0, r.tickSetAt.Load()); set.After(from) {
						from = set // the timer was recreated
					}
					if p == 0 || now.Sub(from) < p {
						continue
					}
					last[r] = now
					if err := w.tickRoot(r.id); err != nil {
						h.hostLog(w, LogError, "proxy_on_tick: "+err.Error())
					}
				}
			}
			for r := range last {
				if r.tickPeriod.Load() == 0 && now.Sub(last[r]) > time.Minute {
					delete(last, r) // a root shut down, or idle
				}
			}
		}
	}
}

func (h *Host) log(e LogEntry) {
	if e.Level < h.opts.MinLogLevel {
		return
	}
	h.logMu.Lock()
	if len(h.logs) < h.opts.MaxLogs {
		h.logs = append(h.logs, e)
	} else {
		h.logs[h.logHead] = e
		h.logHead = (h.logHead + 1) % len(h.logs)
	}
	h.logMu.Unlock()
	msg := e.Message
	if e.Host {
		msg = "host: " + msg
	}
	h.opts.LogSink(e.Level, msg)
}

// hostLog records a message from the host itself; w may be nil.
func (h *Host) hostLog(w *worker, level LogLevel, msg string) {
	e := LogEntry{Level: level, Message: msg, Host: true, Worker: -1}
	if w != nil {
		e.Worker = w.index
		e.Context = w.curID.Load()
	}
	h.log(e)
}

func stderrSink(level LogLevel, msg string) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", level, msg)
}

// lineWriter turns a guest's WASI stdout or stderr into host log lines.
type lineWriter struct {
	h     *Host
	w     *worker
	level LogLevel
	name  string

	mu  sync.Mutex
	buf []byte
}

// Write logs every complete line of p; a partial line waits for the rest.
func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			break
		}
		line := string(l.buf[:i])
		if l.w != nil && l.w.starting && l.level >= LogError {
			l.w.startErrs = append(l.w.startErrs, line)
		}
		l.h.hostLog(l.w, l.level, "guest "+l.name+": "+line)
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

// randReader is the guest's WASI random source.
var randReader = rand.Reader

// wallNow is the host's wall clock: Options.Walltime if set.
func (h *Host) wallNow() time.Time {
	if h.opts.Walltime != nil {
		sec, nsec := h.opts.Walltime()
		return time.Unix(sec, int64(nsec))
	}
	return time.Now()
}
