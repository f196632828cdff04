package filter

// This file holds what the request path needs precomputed at configuration
// time, and the optional host methods it uses to avoid copies. Inside the
// wasm guest every allocation costs hundreds of nanoseconds and every
// strconv call dozens of Go calls, so the request path formats into reused
// buffers and builds nothing it could have built once.

// headerBytesSetter is implemented by hosts that can set or add a response
// header from a byte slice without converting it to a string first
// (filter/abi: the host copies the value during the call).
type headerBytesSetter interface {
	// SetResponseHeaderBytes is SetResponseHeader with the value as bytes;
	// the host must not keep value after the call.
	SetResponseHeaderBytes(name string, value []byte)
	// AddResponseHeaderBytes is AddResponseHeader with the value as bytes.
	AddResponseHeaderBytes(name string, value []byte)
}

// propertyStringer is implemented by hosts that can return a property as a
// string without a copy, valid until the callback returns (filter/abi).
type propertyStringer interface {
	PropertyString(path ...string) (string, bool)
}

// bytesLogger is implemented by hosts that can log a message held in a byte
// slice (filter/abi); the host must not keep msg after the call.
type bytesLogger interface {
	LogBytes(level LogLevel, msg []byte)
}

// bytesViewer is implemented by hosts that can give a string view of a
// byte slice without copying it (filter/abi, which alone may use unsafe).
// The filter uses it for buffers it does not touch again until the next
// request or rejection: the request's shared-data keys (sharedstate.Store
// forbids keeping a key past the call) and the 429's header values (hosts
// copy them).
type bytesViewer interface {
	// ViewString returns a string sharing b's bytes: valid while b is not
	// modified.
	ViewString(b []byte) string
}

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
