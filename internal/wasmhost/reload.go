package wasmhost

import "fmt"

// Reconfigure hands every worker's root context a new plugin
// configuration through proxy_on_configure, as a configuration update does
// to a running plugin, with the streams of every worker left as they are
// (held ones stay held). Later worker restarts use the new configuration.
// It returns an error naming the workers that refused it (the filter then
// keeps its previous configuration).
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
	h.opts.PluginConfig = append([]byte(nil), cfg...)
	var refused []int
	for _, w := range h.workers {
		ok, err := w.callRoot("proxy_on_configure", rootContextID, uint64(len(cfg)))
		if err != nil {
			return fmt.Errorf("host: worker %d: proxy_on_configure: %w", w.index, err)
		}
		if uint32(ok) == 0 {
			refused = append(refused, w.index)
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("host: workers %v refused the configuration: proxy_on_configure returned false", refused)
	}
	return nil
}
