//go:build wasip1

package abi

import "runtime/metrics"

// Debug exports for benchmarks and the local host. They are not part of the
// proxy-wasm ABI; Envoy and other hosts never call them.

var heapSamples = []metrics.Sample{
	{Name: "/gc/heap/allocs:bytes"},
	{Name: "/gc/heap/allocs:objects"},
	{Name: "/memory/classes/total:bytes"},
}

func readHeap(i int) uint64 {
	metrics.Read(heapSamples)
	if heapSamples[i].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return heapSamples[i].Value.Uint64()
}

// tokengateHeapAllocBytes returns the bytes the guest has allocated on its
// heap since it started (cumulative).
//
//go:wasmexport tokengate_debug_heap_alloc_bytes
func tokengateHeapAllocBytes() uint64 { return readHeap(0) }

// tokengateHeapAllocObjects returns the number of heap objects the guest
// has allocated since it started (cumulative).
//
//go:wasmexport tokengate_debug_heap_alloc_objects
func tokengateHeapAllocObjects() uint64 { return readHeap(1) }

// tokengateMemoryBytes returns all memory the Go runtime has mapped.
//
//go:wasmexport tokengate_debug_memory_bytes
func tokengateMemoryBytes() uint64 { return readHeap(2) }
