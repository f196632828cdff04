package filter

// This file holds what the request path needs precomputed at configuration
// time; the optional host methods it uses to avoid copies are in host.go.
// Inside the wasm guest every allocation costs hundreds of nanoseconds and
// every strconv call dozens of Go calls, so the request path formats into
// reused buffers and builds nothing it could have built once.

// sourceAddress is the path of the client address property, allocated once
// (a variadic call through an interface would allocate it per request).
var sourceAddress = []string{"source", "address"}

// setHeader sets a response header from buf.
func (p *Plugin) setHeader(name string, buf []byte) {
	if p.hbs != nil {
		p.hbs.SetResponseHeaderBytes(name, buf)
		return
	}
	p.host.SetResponseHeader(name, string(buf))
}
