//go:build wasip1

package abi

import "runtime"

// Debug exports for benchmarks and the local host. They are not part of the
// proxy-wasm ABI; Envoy and other hosts never call them.
//
// They read runtime.MemStats, which flushes every per-P allocation cache
// first, so the counts are exact to the object even across one request
// (runtime/metrics' /gc/heap/allocs only sees an allocation once its span is
// full). The stop-the-world it costs is nothing in a single-threaded VM.

var memStats runtime.MemStats

// tokengateHeapAllocBytes returns the bytes the guest has allocated on its
// heap since it started (cumulative).
//
//go:wasmexport tokengate_debug_heap_alloc_bytes
func tokengateHeapAllocBytes() uint64 {
	runtime.ReadMemStats(&memStats)
	return memStats.TotalAlloc
}

// tokengateHeapAllocObjects returns the number of heap objects the guest
// has allocated since it started (cumulative).
//
//go:wasmexport tokengate_debug_heap_alloc_objects
func tokengateHeapAllocObjects() uint64 {
	runtime.ReadMemStats(&memStats)
	return memStats.Mallocs
}

// tokengateMemoryBytes returns all memory the Go runtime has obtained from
// the linear memory (MemStats.Sys).
//
//go:wasmexport tokengate_debug_memory_bytes
func tokengateMemoryBytes() uint64 {
	runtime.ReadMemStats(&memStats)
	return memStats.Sys
}
