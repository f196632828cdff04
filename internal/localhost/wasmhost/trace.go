package wasmhost

// Call is one call across the ABI: a callback the host made into the guest
// (proxy_on_request_headers, proxy_on_tick, ...) or a host function the
// guest called (proxy_continue_stream, ...). Options.Observe sees every
// one, in order; Options.Fault may answer a host function in its place.
type Call struct {
	// Worker is the index of the worker VM.
	Worker int
	// Name is the export or import name.
	Name string
	// Guest reports a callback into the guest; false for a host function.
	Guest bool
	// Context is, for a host function, the context the call acts on: the
	// running stream, or the one the guest made effective; 0 in a root
	// callback. For a callback, its first argument (the context id).
	Context uint32
	// Root is the root context of the running callback: the root called,
	// or the root the stream was created under.
	Root uint32
	// Args are the call's arguments (wasm values; pointers are guest
	// addresses).
	Args []uint64
}

// observeGuest reports a callback into the guest to Options.Observe. w.mu
// is held.
func (w *worker) observeGuest(name string, args []uint64) {
	o := w.h.opts.Observe
	if o == nil {
		return
	}
	c := Call{Worker: w.index, Name: name, Guest: true, Root: w.curRoot, Args: append([]uint64(nil), args...)}
	if len(args) > 0 {
		c.Context = uint32(args[0])
	}
	o(c)
}

// hostCall reports a host function call to Options.Observe and asks
// Options.Fault whether to answer it in the function's place. w.mu is
// held.
func (h *Host) hostCall(w *worker, name string, stack []uint64) (Status, bool) {
	o, f := h.opts.Observe, h.opts.Fault
	if o == nil && f == nil {
		return 0, false
	}
	params := envImports[name].params
	c := Call{Worker: w.index, Name: name, Context: w.curID.Load(), Root: w.curRoot, Args: make([]uint64, len(params))}
	for i, t := range params {
		c.Args[i] = stack[i]
		if t == i32 {
			c.Args[i] = uint64(uint32(stack[i])) // the upper half of an i32 slot is not defined
		}
	}
	if o != nil {
		o(c)
	}
	if f != nil {
		return f(c)
	}
	return 0, false
}
