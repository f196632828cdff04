//go:build wasip1

package bucket

// fastTake: see fast_native.go. The compiler folds the fast path away.
const fastTake = false
