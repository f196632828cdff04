package wasmhost

import "fmt"

// Reconfigure applies a new plugin configuration as Envoy applies a
// changed one (roots.go): in every worker VM a new root context is
// created (proxy_on_context_create with a fresh id, proxy_on_vm_start,
// proxy_on_configure) and new streams go to it, while the previous root
// keeps the streams created under it, held ones included, and its own
// tick, until the last of them ends; then it gets proxy_on_done and
// proxy_on_delete. Later worker restarts use the new configuration.
//
// If any worker refuses the configuration (proxy_on_configure or
// proxy_on_vm_start returns false), Envoy rejects the update: the new
// root contexts are shut down again, every worker keeps its previous
// root, and the error names the workers that refused.
func (h *Host) Reconfigure(cfg []byte) error {
	for i, w := range h.workers {
		if err := w.acquire(); err != nil {
			for _, held := range h.workers[:i] {
				held.mu.Unlock()
			}
			return err
		}
	}
	defer func() {
		for _, w := range h.workers {
			w.mu.Unlock()
		}
	}()
	old := h.opts.PluginConfig
	h.opts.PluginConfig = append([]byte(nil), cfg...)
	added := make([]*rootCtx, len(h.workers))
	var refused []int
	for i, w := range h.workers {
		r, ok, err := w.addRoot()
		if err != nil {
			return fmt.Errorf("host: worker %d: %w", w.index, err)
		}
		added[i] = r
		if !ok {
			refused = append(refused, w.index)
		}
	}
	if len(refused) > 0 {
		h.opts.PluginConfig = old
		for i, w := range h.workers {
			w.dropRoot(added[i])
		}
		return fmt.Errorf("host: workers %v refused the configuration: proxy_on_configure returned false", refused)
	}
	for _, w := range h.workers {
		rs := w.rootList()
		for _, r := range rs[:len(rs)-1] {
			r.retired = true
		}
		w.reapRoots() // a previous root without streams goes at once
	}
	return nil
}

// addRoot starts a new root context with the host's plugin configuration
// and makes it the current one. ok is false if the guest refused it (the
// root is then still in the list: dropRoot removes it). w.mu must be held.
func (w *worker) addRoot() (r *rootCtx, ok bool, err error) {
	r = &rootCtx{id: w.nextID}
	w.nextID++
	w.setRoots(append(append([]*rootCtx(nil), w.rootList()...), r))
	if _, err := w.callRoot("proxy_on_context_create", uint64(r.id), 0); err != nil {
		return r, false, fmt.Errorf("proxy_on_context_create(root %d): %w", r.id, err)
	}
	if w.fns["proxy_on_vm_start"] != nil {
		res, err := w.callRoot("proxy_on_vm_start", uint64(r.id), uint64(len(w.h.opts.VMConfig)))
		if err != nil {
			return r, false, fmt.Errorf("proxy_on_vm_start(root %d): %w", r.id, err)
		}
		if uint32(res) == 0 {
			return r, false, nil
		}
	}
	if w.fns["proxy_on_configure"] != nil {
		res, err := w.callRoot("proxy_on_configure", uint64(r.id), uint64(len(w.h.opts.PluginConfig)))
		if err != nil {
			return r, false, fmt.Errorf("proxy_on_configure(root %d): %w", r.id, err)
		}
		if uint32(res) == 0 {
			return r, false, nil
		}
	}
	return r, true, nil
}

// dropRoot shuts down a root context that never served a stream (a refused
// configuration) and takes it out of the list, leaving the previous root
// current. w.mu must be held.
func (w *worker) dropRoot(r *rootCtx) {
	if r == nil || w.failed != nil {
		return
	}
	if _, err := w.callRoot("proxy_on_done", uint64(r.id)); err == nil {
		_, _ = w.callRoot("proxy_on_delete", uint64(r.id))
	}
	var keep []*rootCtx
	for _, x := range w.rootList() {
		if x != r {
			keep = append(keep, x)
		}
	}
	w.setRoots(keep)
}
