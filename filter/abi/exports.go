//go:build wasip1

package abi

import "github.com/tokengate/tokengate/filter"

// The context table: root contexts (one per plugin) and HTTP contexts (one
// per request), by id. This is the only mutable package-level state besides
// the pinned buffers; a VM runs one callback at a time.
var (
	roots   = map[uint32]*filter.Plugin{}
	streams streamTable // see contexts.go
)

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootID, vmConfigSize uint32) (ok bool) {
	enter()
	defer guard("proxy_on_vm_start", func() { ok = false })
	cfg, err := bufferBytes(bufferVMConfiguration, vmConfigSize)
	if err != nil {
		theHost.Log(filter.LogError, "tokengate: cannot read the VM configuration: "+err.Error())
		return false
	}
	return root(rootID).OnVMStart(cfg)
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(id, parent uint32) {
	enter()
	defer guard("proxy_on_context_create", nil)
	if parent == 0 {
		root(id)
		return
	}
	if p, ok := roots[parent]; ok {
		s := p.NewStream()
		s.SetID(id)
		streams.put(id, s)
	}
}

// root returns the plugin of a root context, creating it on first use:
// APISIX never calls proxy_on_vm_start, and Envoy may create the root
// context after it.
func root(id uint32) *filter.Plugin {
	p, ok := roots[id]
	if !ok {
		p = filter.NewPlugin(theHost)
		p.Clock = realtime
		roots[id] = p
	}
	return p
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, size uint32) (ok bool) {
	enter()
	defer guard("proxy_on_configure", func() { ok = false })
	cfg, err := bufferBytes(bufferPluginConfiguration, size)
	if err != nil {
		theHost.Log(filter.LogError, "tokengate: cannot read the plugin configuration: "+err.Error())
		return false
	}
	return root(rootID).OnConfigure(cfg)
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(id, numHeaders, endOfStream uint32) (act uint32) {
	enter()
	defer guard("proxy_on_request_headers", func() { act = uint32(filter.Continue) })
	s, ok := streams.get(id)
	if !ok {
		return uint32(filter.Continue)
	}
	return uint32(s.OnRequestHeaders(int(numHeaders), endOfStream != 0))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(id, numHeaders, endOfStream uint32) (act uint32) {
	enter()
	defer guard("proxy_on_response_headers", func() { act = uint32(filter.Continue) })
	s, ok := streams.get(id)
	if !ok {
		return uint32(filter.Continue)
	}
	return uint32(s.OnResponseHeaders(int(numHeaders), endOfStream != 0))
}

// proxyOnRequestBody holds the body only of a request that awaits its
// estimate from it (filter/estimate.go).
//
//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(id, size, endOfStream uint32) (act uint32) {
	enter()
	defer guard("proxy_on_request_body", func() { act = uint32(filter.Continue) })
	if s, ok := streams.get(id); ok {
		return uint32(s.OnRequestBody(int(size), endOfStream != 0))
	}
	return uint32(filter.Continue)
}

// proxyOnRequestTrailers ends the body of a request that awaits its
// estimate (filter.Stream.OnRequestBody recovers its own panics).
//
//go:wasmexport proxy_on_request_trailers
func proxyOnRequestTrailers(id, n uint32) uint32 {
	enter()
	if s, ok := streams.get(id); ok {
		return uint32(s.OnRequestBody(filter.BodyEnded, true))
	}
	return uint32(filter.Continue)
}

// proxyOnResponseBody reads the body only for a rule whose cost the body
// reports; it always continues (the response is never held).
//
//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(id, size, endOfStream uint32) (act uint32) {
	enter()
	defer guard("proxy_on_response_body", func() { act = uint32(filter.Continue) })
	if s, ok := streams.get(id); ok {
		return uint32(s.OnResponseBody(int(size), endOfStream != 0))
	}
	return uint32(filter.Continue)
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(id, n uint32) (act uint32) {
	enter()
	defer guard("proxy_on_response_trailers", func() { act = uint32(filter.Continue) })
	if s, ok := streams.get(id); ok {
		return uint32(s.OnResponseTrailers(int(n)))
	}
	return uint32(filter.Continue)
}

//go:wasmexport proxy_on_log
func proxyOnLog(id uint32) {}

// proxyOnDone settles what the stream left unsettled and releases its
// places in flight, however it ended.
//
//go:wasmexport proxy_on_done
func proxyOnDone(id uint32) bool {
	enter()
	defer guard("proxy_on_done", nil)
	if s, ok := streams.get(id); ok {
		s.OnDone()
	}
	return true
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(id uint32) {
	enter()
	defer guard("proxy_on_delete", nil)
	if s, ok := streams.remove(id); ok {
		s.Release()
		return
	}
	delete(roots, id)
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootID uint32) {
	enter()
	defer guard("proxy_on_tick", nil)
	if p, ok := roots[rootID]; ok {
		p.OnTick()
	}
}

//go:wasmexport proxy_on_queue_ready
func proxyOnQueueReady(rootID, queueID uint32) {}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(rootID, callID, numHeaders, bodySize, numTrailers uint32) {
	enter()
	defer guard("proxy_on_http_call_response", nil)
	if p, ok := roots[rootID]; ok {
		p.OnHTTPCallResponse(callID, int(numHeaders), int(bodySize), int(numTrailers))
	}
}

// guard is the last line of defence: the filter recovers its own panics,
// this catches any in the binding itself. fail sets the fail-open result.
func guard(callback string, fail func()) {
	if v := recover(); v != nil {
		if fail != nil {
			fail()
		}
		msg := "tokengate: recovered panic in " + callback + ", failing open"
		if s, ok := v.(string); ok {
			msg += ": " + s
		}
		proxyLog(uint32(filter.LogCritical), ptr(msg), uint32(len(msg)))
	}
}
