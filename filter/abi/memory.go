//go:build wasip1

package abi

import "unsafe"

// Memory the host returns.
//
// The host allocates guest memory for every value it returns (a header, a
// shared-data value, a property) by calling malloc, then writes the value
// and its address into the guest. Most values are a few dozen bytes and are
// read at once, so malloc carves them from one static arena instead of the
// heap: a request allocates nothing for them and the garbage collector
// never sees them. Values larger than what is left of the arena get their
// own heap buffer, kept reachable in pinned.
//
// Lifetime: the arena is reset when the host enters the next callback
// (enter), so a returned value stays valid until the callback that asked
// for it returns. Callers that keep a value longer copy it (bufferBytes
// does, for the configuration).
//
// Safety: returned only accepts an address that malloc handed out during
// the current import call (since the last unpin), with a size that fits;
// it never dereferences an address the host made up.

// arenaSize is the static arena's size: room for every value one request
// reads (headers, the client address, a few shared-data values) many times
// over.
const arenaSize = 16 << 10

var (
	arena    [arenaSize]byte
	arenaOff int // first free byte of arena in this callback

	// given holds the buffers malloc handed out since the current import
	// call started (see unpin); returned searches it.
	given [][]byte
	// pinned holds heap buffers handed out in this callback, so the
	// garbage collector keeps them until the callback ends.
	pinned [][]byte

	// bodyWindow receives the pieces of the response body ResponseBody
	// reads, while wantWindow is set; each read overwrites the last.
	bodyWindow [8 << 10]byte
	wantWindow bool
)

// malloc is how the host (proxy-wasm-cpp-host, ngx_wasm_module) allocates
// guest memory for the values it returns.
//
//go:wasmexport malloc
func malloc(size uint32) unsafe.Pointer { return allocate(size) }

// proxyOnMemoryAllocate is the ABI's name for malloc.
//
//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) unsafe.Pointer { return allocate(size) }

func allocate(size uint32) unsafe.Pointer {
	n := int(size)
	if n == 0 {
		n = 1
	}
	var b []byte
	if wantWindow && n <= len(bodyWindow) {
		// A piece of the response body (host.ResponseBody): always the
		// same static buffer, so reading a body of any size holds at most
		// one window.
		wantWindow = false
		b = bodyWindow[:n:n]
	} else if off := (arenaOff + 7) &^ 7; n <= arenaSize-off {
		b = arena[off : off+n : off+n]
		arenaOff = off + n
	} else {
		b = make([]byte, n)
		pinned = append(pinned, b)
	}
	given = append(given, b)
	return unsafe.Pointer(&b[0])
}

// enter starts a callback: the values returned during the previous one are
// forgotten and the arena is reused.
func enter() {
	arenaOff = 0
	clear(pinned)
	pinned = pinned[:0]
	unpin()
}

// unpin starts an import call: only buffers handed out from now on are
// accepted by returned.
func unpin() {
	clear(given)
	given = given[:0]
}

// returned finds the buffer the host returned at guest address addr, among
// those malloc handed out during this import call; it never dereferences an
// address the host made up. The slice is valid until the callback returns.
func returned(addr, size uint32) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	for _, b := range given {
		if uint32(uintptr(unsafe.Pointer(&b[0]))) == addr && int(size) <= len(b) {
			return b[:size:size], true
		}
	}
	return nil, false
}

// ptr returns the address of s's bytes for the host to read.
func ptr(s string) unsafe.Pointer {
	if s == "" {
		return nil
	}
	return unsafe.Pointer(unsafe.StringData(s))
}

func bptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// viewString returns b as a string without copying. It is the module's one
// unsafe string conversion; every caller must hand it bytes that nothing
// writes while the string is in use. Its callers, audited:
//
//   - host.RequestHeader and host.PropertyString: b is arena memory the
//     host filled during this import call; the arena is reused only by the
//     next callback, and filter.Host documents that such values are valid
//     until the callback returns.
//   - host.ViewString: b is one of the filter's own buffers (keys, header
//     values, replies) that the filter leaves untouched until its next
//     request; the host copies what it keeps.
func viewString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
