//go:build wasip1

// Command primitives is a tiny wasm guest for BenchmarkGuestPrimitives
// (bench/primitives_test.go): each export repeats one Go construct n times,
// so that the benchmark can price it inside wazero, next to the ABI
// crossings every tokengate request makes. It is built with the same
// toolchain and flags as the filter (GOOS=wasip1 GOARCH=wasm,
// -buildmode=c-shared) and imports two host functions: noop, and
// callback, which calls back into the guest's malloc as a host returning a
// value does.
package main

import "unsafe"

//go:wasmimport env noop
func noop(a, b uint32) uint32

//go:wasmimport env callback
func callback(ret unsafe.Pointer) uint32

var (
	ret   uint32
	arena [4096]byte
	off   int
	sink  []byte
	table = map[uint32]*int{0: new(int), 1: new(int), 2: new(int), 3: new(int)}
)

// malloc hands out arena memory, as filter/abi's does.
//
//go:wasmexport malloc
func malloc(n uint32) unsafe.Pointer {
	if off+int(n) > len(arena) {
		off = 0
	}
	p := unsafe.Pointer(&arena[off])
	off += int(n)
	return p
}

//go:wasmexport empty
func empty() {}

//go:wasmexport host_call
func hostCall(n uint32) (s uint32) {
	for i := range n {
		s += noop(i, 1)
	}
	return s
}

//go:wasmexport host_call_malloc
func hostCallMalloc(n uint32) (s uint32) {
	for range n {
		s += callback(unsafe.Pointer(&ret))
	}
	return s
}

//go:noinline
func add1(x uint32) uint32 { return x + 1 }

//go:wasmexport go_call
func goCall(n uint32) (s uint32) {
	for range n {
		s = add1(s)
	}
	return s
}

//go:noinline
func deferred(x uint32) (r uint32) {
	defer func() {
		if recover() != nil {
			r = 0
		}
	}()
	return x + 1
}

//go:wasmexport defer_recover
func deferRecover(n uint32) (s uint32) {
	for range n {
		s = deferred(s)
	}
	return s
}

//go:wasmexport map_lookup
func mapLookup(n uint32) (s uint32) {
	for i := range n {
		if _, ok := table[i&3]; ok {
			s++
		}
	}
	return s
}

//go:wasmexport alloc48
func alloc48(n uint32) uint32 {
	for range n {
		sink = make([]byte, 48)
	}
	return 0
}

//go:wasmexport format10
func format10(n uint32) uint32 {
	var buf [24]byte
	for i := range n {
		v := uint64(i) + 1_000_000_000
		j := len(buf)
		for v > 0 {
			j--
			buf[j] = byte('0' + v%10)
			v /= 10
		}
		sink = buf[j:]
	}
	return 0
}

func main() {}
