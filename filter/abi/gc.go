//go:build wasip1

package abi

import _ "unsafe" // for go:linkname

// gcPercent is the guest's GOGC. The request path allocates a few dozen
// bytes a request and the live heap (configuration, context tables,
// buffers) is a few hundred KB, so Go's default of 100, a heap of at least
// 4 MiB before the first collection, only makes every worker VM map more
// linear memory, which never shrinks. At 25 the heap is collected at about
// 1 MiB; a collection of so small a heap costs well under a millisecond,
// once every few tens of thousands of requests.
const gcPercent = 25

// setGCPercent is runtime/debug.SetGCPercent's implementation in the
// runtime. Importing runtime/debug itself would link fmt and os (130 KB).
//
//go:linkname setGCPercent runtime/debug.setGCPercent
func setGCPercent(int32) int32

func init() { setGCPercent(gcPercent) }
