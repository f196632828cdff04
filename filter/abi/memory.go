//go:build wasip1

package abi

import "unsafe"

// pinned holds the buffers handed to the host by malloc since the last
// import call started; see the package doc.
var pinned [][]byte

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
	if size == 0 {
		size = 1
	}
	b := make([]byte, size)
	pinned = append(pinned, b)
	return unsafe.Pointer(&b[0])
}

// unpin forgets the buffers of the previous call.
func unpin() {
	clear(pinned)
	pinned = pinned[:0]
}

// returned finds the buffer the host returned at guest address addr, among
// those it allocated during this call; it never dereferences an address the
// host made up.
func returned(addr, size uint32) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	for _, b := range pinned {
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
