//go:build !wasip1

package bucket

// fastTake enables Take's fast path for a plain continuous bucket (see
// Limit.Take). Native builds only: the wasm guest, which runs this package
// too, has no room for the second copy of the arithmetic.
const fastTake = true
