package wasmhost

// Response trailers: when the upstream sends trailers, Envoy ends the
// response with them rather than with the body: the body's last
// proxy_on_response_body has end_of_stream 0 and
// proxy_on_response_trailers(num_trailers) follows, with the trailers
// readable and writable as RESPONSE_TRAILERS (map type 3) during that
// callback and proxy_on_log. How an upstream's trailers reach the host
// over HTTP is the proxy's (internal/localhost/proxy/trailers.go).

// responseTrailers runs proxy_on_response_trailers on s's trailers. w.mu
// must be held; it stays held.
func (w *worker) responseTrailers(s *stream) error {
	_, err := w.callStream(s, phaseResponseTrailers, "proxy_on_response_trailers", uint64(s.id), uint64(len(s.respTrailers.h)))
	return err
}

// GuestCalls returns how many times the host has called each guest export
// (proxy_on_response_body, proxy_on_response_trailers, ...) on every
// worker since the host started, by export name (only exports called at
// least once; a missing export is not counted).
func (h *Host) GuestCalls() map[string]uint64 {
	out := make(map[string]uint64)
	for _, w := range h.workers {
		w.mu.Lock()
		for name, n := range w.guestCalls {
			out[name] += n
		}
		w.mu.Unlock()
	}
	return out
}
